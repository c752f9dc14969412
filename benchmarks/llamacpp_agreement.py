"""Agreement with llama.cpp on one GGUF (issue 51): how many chat prompts give the same
first ``--tokens`` greedy tokens, and each engine's top-2 logit margin where they first split (ours: file kept
quantized, top-20 log-probabilities; llama.cpp: the sdist's bindings with every position's logits).

    PYTHONPATH=/path/with/diskcache python benchmarks/llamacpp_agreement.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from llamacpp_rows import LLAMA_BIN, LLAMA_PY, PlainLlama
from selftest_check import model_path

import harness

PROMPT_FILES = ("examples/prompts/edit_tasks.txt", "examples/prompts/chat_heldout.txt")


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def compare(ours: list[int], our_lps: list[dict[int, float]], theirs: list[int], scores: np.ndarray) -> dict[str, Any]:
    """One prompt: ``scores`` [len(theirs), V] llama.cpp's logits before each of its tokens."""
    i = first_difference(ours, theirs)
    if i is None:
        return {"same": True}
    lp = our_lps[i]
    top = sorted(lp.values(), reverse=True)
    row = scores[i]
    two = np.sort(row)[-2:]
    return {"same": False, "first_difference": i,
            "ours_top2_margin": round(top[0] - top[1], 4),
            "ours_gap_to_theirs": round(lp[ours[i]] - lp[theirs[i]], 4) if theirs[i] in lp else None,
            "llamacpp_top2_margin": round(float(two[1] - two[0]), 4),
            "llamacpp_gap_to_ours": round(float(row[theirs[i]] - row[ours[i]]), 4)}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "llamacpp_agreement_qwen15b.json", threads=2)
    ap.add_argument("--model", default="qwen-1.5b-q4km", help="a fetch_gguf_parts name or a .gguf path")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--llama-py", default=LLAMA_PY)
    ap.add_argument("--llama-bin", default=LLAMA_BIN)
    args = ap.parse_args()
    bench = harness.start("llamacpp_agreement", args, busy_warning=False)
    from transformers import AutoTokenizer

    from speculant import LLM, SamplingParams
    from speculant.bench import load_prompts, render_prompts
    from speculant.model.loading.gguf_source import resolve_model_source

    path = model_path(args.model)
    texts = [t for f in PROMPT_FILES for t in load_prompts(f)]
    ids = render_prompts(AutoTokenizer.from_pretrained(resolve_model_source(path, None, "bfloat16")), texts, True)
    llm = LLM(model=path, max_num_seqs=1, max_num_batched_tokens=512, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True, logprobs=20)
    ours = [llm.generate([p], params, use_tqdm=False)[0].outputs[0] for p in ids]
    quant = llm.engine.runner.quant_report.describe() if llm.engine.runner.quant_report else None
    head = llm.engine.runner.model.get_output_embeddings()
    logits_dtype = str(getattr(head, "out_dtype", None) or getattr(head, "compute_dtype", head.weight.dtype))
    del llm
    llama = PlainLlama(args.llama_py, args.llama_bin, path, args.threads, ctx=1024, logits_all=True)
    rows = []
    for p, o in zip(ids, ours):
        theirs, _ = llama.generate(p, args.tokens)
        scores = np.array(llama.llm.scores[len(p) - 1:len(p) - 1 + len(theirs)])
        rows.append({"prompt_tokens": len(p), **compare(list(o.token_ids), o.logprobs or [], theirs, scores)})
        bench.log(f"prompt {len(rows)}: {rows[-1]}")
    llama.close()
    same = sum(r["same"] for r in rows)
    split = [r for r in rows if not r["same"]]
    bench.log(f"{same}/{len(rows)} prompts give the same first {args.tokens} greedy tokens")
    bench.write({"model": Path(path).name, "quantized_layers": quant, "logits_dtype": logits_dtype,
                 "prompt_files": list(PROMPT_FILES),
                 "same_first_tokens": same, "prompts": len(rows),
                 "max_top2_margin_at_split": max((max(r["ours_top2_margin"], r["llamacpp_top2_margin"])
                                                  for r in split), default=None),
                 "rows": rows})


if __name__ == "__main__":
    main()
