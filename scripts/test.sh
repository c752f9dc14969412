#!/usr/bin/env bash
# Install Speculant with its test extra into .venv (first run only) and run the test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" test
cd "$ROOT"
# a crash (also one at interpreter exit) prints every thread's Python stack
export PYTHONFAULTHANDLER=1
python -m pytest "$@"
