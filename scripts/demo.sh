#!/usr/bin/env bash
# Install Speculant into .venv (first run only), then generate with speculation on the
# bundled demo models (models/demo-target + models/demo-draft, examples/demo.toml),
# compared with the same request without speculation.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
speculant generate --config examples/demo.toml --compare --max-tokens 128 "${@:-def fibonacci(n):}"
