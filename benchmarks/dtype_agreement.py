"""Greedy agreement in reduced precision over the architecture matrix.

For every verified architecture (tests/arch_zoo.py) and each of bfloat16 and
float16, on the matrix's seven prompts (20 greedy tokens each): how many
outputs of the engine without speculation equal transformers' ``generate()``
in the same dtype token for token, how many of the speculative engine's
outputs (ngram + mqa, draft + batch expansion) equal the non-speculative
engine's, and at every first difference the logit gap, on transformers'
logits in that dtype, between the two tokens (a near-tie is a small gap).
float32 is exact (the matrix test); this file measures what reduced precision
gives. Results: benchmarks/results/dtype_agreement.json, with the environment
(``harness.py``). One torch thread unless ``--threads``.

    python benchmarks/dtype_agreement.py [--archs llama,phi3]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

import harness

sys.path.insert(0, str(harness.REPO_ROOT / "tests"))
from arch_zoo import VERIFIED, build_arch_model, noisy_copy
from speculant import LLM, SamplingParams
from tiny_models import build_tokenizer, random_prompts

MAX_TOKENS = 20
SPEC = {
    "ngram-mqa": dict(proposer="ngram", scorer="mqa", num_speculative_tokens=3),
    "draft-batch-expansion": dict(proposer="draft_model", scorer="batch_expansion", num_speculative_tokens=3),
}


def prompts() -> list[list[int]]:
    pattern = random_prompts([6], seed=9)[0]
    return random_prompts([1, 3, 4, 5, 17, 61], seed=1) + [pattern * 4]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)


@torch.inference_mode()
def hf_greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_TOKENS,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@torch.inference_mode()
def gap_at(model, prompt: list[int], common: list[int], ours: int, theirs: int) -> float:
    """Relative logit gap between two candidate tokens after ``prompt + common``."""
    logits = model(torch.tensor([prompt + common])).logits[0, -1].float()
    return float(logits[theirs] - logits[ours]).__abs__() / max(1.0, float(logits.abs().max()))


def run_arch(arch: str, root: Path, tok: Path, dtype: str) -> dict:
    from transformers import AutoModelForCausalLM

    target = build_arch_model(arch, root / arch, tok) if not (root / arch).exists() else root / arch
    draft = root / f"{arch}-draft"
    if not draft.exists():
        noisy_copy(target, draft)
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).eval()
    ps = prompts()
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(target), dtype=dtype, max_num_batched_tokens=64,
                                                  max_num_seqs=7).generate(ps, sp, use_tqdm=False)]
    row: dict = {"vs_transformers": {"equal": 0, "outputs": len(ps), "gaps": []}}
    for p, ours in zip(ps, plain):
        ref = hf_greedy(hf, p)
        j = first_difference(ours, ref)
        if j is None:
            row["vs_transformers"]["equal"] += 1
        else:
            row["vs_transformers"]["gaps"].append(round(gap_at(hf, p, ref[:j], ours[j], ref[j]), 6))
    for name, spec in SPEC.items():
        spec = dict(spec)
        if spec["proposer"] == "draft_model":
            spec["proposer_options"] = {"model": str(draft)}
        llm = LLM(str(target), dtype=dtype, max_num_batched_tokens=64, max_num_seqs=7, speculative=spec)
        outs = [o.outputs[0].token_ids for o in llm.generate(ps, sp, use_tqdm=False)]
        cell = {"equal": 0, "outputs": len(ps), "gaps": []}
        for p, ours, base in zip(ps, outs, plain):
            j = first_difference(ours, base)
            if j is None:
                cell["equal"] += 1
            else:
                cell["gaps"].append(round(gap_at(hf, p, base[:j], ours[j], base[j]), 6))
        row[f"{name}_vs_no_spec"] = cell
    return row


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "dtype_agreement.json", threads=1)
    ap.add_argument("--archs", default=",".join(VERIFIED))
    ap.add_argument("--dtypes", default="bfloat16,float16")
    args = ap.parse_args()
    bench = harness.start("dtype_agreement", args, busy_warning=False)  # agreement, not speed: any load will do
    results: dict = {"max_tokens": MAX_TOKENS,
                     "gap": "|logit(ours) - logit(theirs)| / max(1, max |logit|) on transformers' logits, same dtype",
                     "archs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_tokenizer(root / "tok")
        for arch in args.archs.split(","):
            results["archs"][arch] = {}
            for dtype in args.dtypes.split(","):
                try:
                    results["archs"][arch][dtype] = run_arch(arch, root, root / "tok", dtype)
                except Exception as exc:  # noqa: BLE001 - report, keep measuring the others
                    results["archs"][arch][dtype] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                print(arch, dtype, json.dumps(results["archs"][arch][dtype])[:300], flush=True)
    bench.write(results)


if __name__ == "__main__":
    main()
