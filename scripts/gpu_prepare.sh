#!/usr/bin/env bash
# Prepare what scripts/gpu_check.sh carries to the GPU machine (no network there):
# CPython 3.12 manylinux wheels of what its image lacks, and the SmolLM2 GGUF split
# in two halves (a run carries at most 64 MiB, the checkout included), into gpu_carry/
# (git-ignored): gpu_carry/stage1/ {wheels/, smollm2.gguf.part1, smollm2.gguf.sha256}
# goes with the first call, gpu_carry/smollm2.gguf.part2 with the second.
set -euo pipefail
cd "$(dirname "$0")/.."
G="${1:-$(python scripts/smollm2_path.py)}"
rm -rf gpu_carry && mkdir -p gpu_carry/stage1/wheels
python -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d gpu_carry/stage1/wheels \
    pydantic pydantic-core annotated-types typing-inspection typing-extensions pluggy gguf accelerate psutil \
    pytest iniconfig pygments packaging hypothesis sortedcontainers attrs pytest-xdist execnet pyyaml tqdm
size=$(stat -c %s "$G")
half=$(( (size + 1) / 2 ))
head -c "$half" "$G" > gpu_carry/stage1/smollm2.gguf.part1
tail -c +"$((half + 1))" "$G" > gpu_carry/smollm2.gguf.part2
(cd "$(dirname "$G")" && sha256sum "$(basename "$G")") | sed 's/ .*$/  smollm2.gguf/' > gpu_carry/stage1/smollm2.gguf.sha256
du -sh gpu_carry/stage1 gpu_carry/smollm2.gguf.part2
