"""Many requests at once against one at a time on a real-size GGUF (issue 51): the
throughput of ``--requests`` concurrent requests over the batch-1 rate of the same
engine, no speculation, side by side in ``--repeats`` alternating rounds.

The edit prompts (chat), greedy, EOS ignored, ``--max-tokens`` new tokens, prefill
included, prefix caching off (the concurrent rows repeat the prompts to fill the
batch). ``batch1``: each of the first ``--batch1-prompts`` prompts alone;
``concurrent``: ``--requests`` requests (the prompts cycled) in one ``generate``.
Each row's rate is its generated tokens over its wall time; the summary gives
their medians, spreads and the per-round ratio concurrent / batch1.

    python benchmarks/real_size_concurrency.py --requests 32 --max-tokens 64 --repeats 3
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selftest_check import model_path

import harness


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "real_size_concurrency.json", repeats=3, threads=2)
    ap.add_argument("--model", default="qwen-1.5b-q4km", help="a fetch_gguf_parts name or a .gguf path")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--batch1-prompts", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    bench = harness.start("real_size_concurrency", args)
    from transformers import AutoTokenizer

    from speculant import LLM, SamplingParams
    from speculant.bench import load_prompts, render_prompts
    from speculant.model.loading.gguf_source import resolve_model_source

    path = model_path(args.model)
    texts = load_prompts("examples/prompts/edit_tasks.txt")
    ids = render_prompts(AutoTokenizer.from_pretrained(resolve_model_source(path, None, "bfloat16")), texts, True)
    llm = LLM(model=path, max_num_seqs=args.requests, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([ids[0][::-1]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    batch = [ids[i % len(ids)] for i in range(args.requests)]

    def run_one(name: str) -> dict[str, Any]:
        todo = [[p] for p in ids[:args.batch1_prompts]] if name == "batch1" else [batch]
        with harness.timed() as t:
            n = sum(len(o.outputs[0].token_ids) for group in todo
                    for o in llm.generate(group, params, use_tqdm=False))
        return {"tok_s": n / t.wall, "tokens": n, "seconds": t.wall}

    runs = harness.rounds(["batch1", "concurrent"], args.repeats, run_one, lambda r: f"{r['tok_s']:.2f} tok/s")
    ratios = harness.per_round_ratios(runs, "concurrent", "batch1", "tok_s")
    summary = {name: {k: round(v, 3) for k, v in harness.summary([r["tok_s"] for r in rs]).items()
                      if k in ("median", "min", "max")} for name, rs in runs.items()}
    summary["ratio"] = {k: round(v, 3) for k, v in harness.summary(ratios).items() if k in ("median", "min", "max")}
    bench.log(f"batch 1 {summary['batch1']['median']:.2f} tok/s, {args.requests} concurrent "
              f"{summary['concurrent']['median']:.2f}, ratio {summary['ratio']['median']:.2f} "
              f"({summary['ratio']['min']:.2f}-{summary['ratio']['max']:.2f})")
    bench.write({"model": Path(path).name, "prompt_tokens": [len(p) for p in ids], "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
