#!/usr/bin/env bash
# The whole GPU check (issue 30) for the lent GPU machine (one H200: torch 2.11 +
# CUDA 13, Triton 3.6, transformers 5.17; no pydantic, no gguf, no network), in
# at most about 8 minutes. A run carries at most 64 MiB, the checkout included,
# so the work is split over two calls on the same warm machine:
#
#   bash scripts/gpu_check.sh stage gpu_carry/*      # call 1: keep wheels + the
#                                                    # first half of the GGUF in /tmp
#   bash scripts/gpu_check.sh run                    # call 2 (the rest carried in
#                                                    # gpu_carry/): install, test, bench
#
# Prepare the carried files here with scripts/gpu_prepare.sh. The checkout travels
# too: leave models/ out of the first call's copy (`git rm -r --cached -q models/`
# and `models/` in .git/info/exclude), put models/smollm2-eagle back for the second
# (`git add -f models/smollm2-eagle`), and restore with `git reset` afterwards. Results go to
# $OUT (the device tool brings that folder back): gpu_env.json, the test log and
# JUnit XML, the Triton kernel check and the bench JSON files, which are then
# committed to benchmarks/results/ (labelled with GPU, date and commit).
set -uo pipefail
cd "$(dirname "$0")/.."
STASH=/tmp/speculant-gpu
OUT="${OUT:-/tmp/speculant-gpu-out}"
mkdir -p "$STASH" "$OUT"

stage() {
  cp -r "$@" "$STASH/"
  ls -la "$STASH"
}

step() {  # step NAME SECONDS CMD...: run one part with its own time limit, never stop the rest
  local name=$1 secs=$2
  shift 2
  echo "== $name (limit ${secs}s): $*"
  local t0=$SECONDS rc
  if declare -F "$1" > /dev/null; then "$@" > "$OUT/$name.log" 2>&1; rc=$?  # a function of this script
  else timeout "$secs" "$@" > "$OUT/$name.log" 2>&1; rc=$?; fi
  echo "$name rc=$rc in $((SECONDS - t0))s" | tee -a "$OUT/steps.txt"
  tail -n 5 "$OUT/$name.log"
}

install() {
  python -m pip install -q --no-index --find-links "$STASH/wheels" pydantic pluggy gguf accelerate psutil pytest \
      hypothesis pytest-xdist pyyaml tqdm || return 1
  python -m pip install -q --no-index --no-deps --no-build-isolation -e . \
      || echo "editable install failed: using PYTHONPATH"
}

gguf() {  # reassemble the SmolLM2 GGUF from its parts and check its digest
  cat "$STASH"/smollm2.gguf.part1 gpu_carry/smollm2.gguf.part2 > "$STASH/smollm2.gguf"
  (cd "$STASH" && sha256sum -c smollm2.gguf.sha256)
}

run() {
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  step install 120 install
  python - > "$OUT/gpu_env.json" <<'EOF'
import json, subprocess, torch, transformers
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = None
print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "transformers": transformers.__version__, "triton": tv,
                  "nvidia_smi": subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout}))
EOF
  cat "$OUT/gpu_env.json"
  step gguf 60 gguf
  G="$STASH/smollm2.gguf"
  # the Triton kernel against the torch reference at real sizes, and its speed
  step triton_check 75 python -m speculant.model.attention.triton_check --json "$OUT/triton_check.json"
  # the suite with CUDA visible: engines take the device from the environment (auto -> cuda)
  # (the architecture matrix's default cells on the CUDA backends, float32, against transformers)
  step tests 120 python -m pytest -q -rfE -n 16 -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" \
      tests/integration/test_arch_matrix.py tests/model/loading/test_dummy_load.py
  # SmolLM2-135M-Instruct bf16 on the edit prompts, batch 1: every proposer, transformers beside it
  head -n 2 examples/prompts/edit_tasks.txt > "$STASH/edit2.txt"
  step bench_smollm2_bs1 110 python -m speculant.cli bench --target "$G" --dtype bfloat16 --chat \
      --prompts "$STASH/edit2.txt" --k 8 --max-tokens 128 --repeats 1 --concurrency 1 \
      --eagle models/smollm2-eagle --device cuda --out "$OUT/gpu_bench_smollm2_bs1.json"
  # 64 concurrent requests: no speculation and suffix vs transformers' static padded batch
  step bench_smollm2_c64 70 python -m speculant.cli bench --target "$G" --dtype bfloat16 --chat \
      --prompts examples/prompts/edit_tasks.txt --k 4 --max-tokens 128 --repeats 1 --concurrency 64 \
      --device cuda --out "$OUT/gpu_bench_smollm2_c64.json"
  # a random-weight 8B llama at alpha = 0.8, k = 4, batch 1
  step bench_llama8b 100 python -m speculant.cli bench --random-llama 8b --alpha 0.8 --k 4 --max-tokens 64 --repeats 1 \
      --dtype bfloat16 --device cuda --out "$OUT/gpu_bench_llama8b.json"
  # the device tool brings back a few files: logs go back as one archive
  (cd "$OUT" && tar czf gpu_logs.tgz ./*.log steps.txt gpu_tests.xml triton_check.json 2>/dev/null \
      && rm -f ./*.log gpu_tests.xml triton_check.json ./*.png)
  echo "done; results in $OUT"
}

case "${1:-}" in
  stage) shift; stage "$@" ;;
  run) run ;;
  *) echo "usage: $0 stage FILE... | run" >&2; exit 2 ;;
esac
