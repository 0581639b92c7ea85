#!/usr/bin/env bash
# Set up (first time) and run the whole test suite: unit, end-to-end and browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"  # idle torch workers sleep: the servers the tests start too
exec .venv/bin/python -m pytest -q "$@"
