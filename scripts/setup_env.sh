#!/usr/bin/env bash
# Create (or reuse) the project virtual environment and install Speculant into it.
# torch is installed first, pinned to the CPU build this project is tested with,
# so pip never pulls a multi-GB CUDA build. Usage: source scripts/setup_env.sh [extra]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECULANT_VENV:-$ROOT/.venv}"
EXTRA="${1:-}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q --disable-pip-version-check "torch==${SPECULANT_TORCH_VERSION:-2.13.0}"
fi
spec="$ROOT"
[ -n "$EXTRA" ] && spec="$ROOT[$EXTRA]"
python -m pip install -q --disable-pip-version-check -e "$spec"
