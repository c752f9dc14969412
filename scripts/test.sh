#!/usr/bin/env bash
# Install Speculant with its test extra into .venv (first run only) and run the test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" test
cd "$ROOT"
python -m pytest "$@"
