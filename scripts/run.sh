#!/usr/bin/env bash
# Set up (first time) and serve the app on the offline default at http://127.0.0.1:7860
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python app.py "$@"
