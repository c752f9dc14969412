#!/usr/bin/env bash
# Install Speculant into .venv (first run only), build the local model pair and
# generate with speculation, comparing against the same run without it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
python scripts/quickstart.py
speculant generate --config examples/quickstart.toml --compare --max-tokens 96 --ignore-eos "${@:-def fibonacci(n):}"
