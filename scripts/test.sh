#!/usr/bin/env bash
# Set up (first time) and run the whole test suite: unit, end-to-end and browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"  # idle torch workers sleep: the servers the tests start too
# Two processes, a test file each at a time (a file's tests share its fixtures and run in order): most tests wait on a
# server, a browser or a subprocess part of the time, so two keep both cores busy (26 min alone, 19 in two).
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
