"""Top-k / top-p looked for among each row's most likely tokens against sorting
the whole vocabulary, on SmolLM2-135M-Instruct bf16: open chat at temperature
1.0, top-p 0.95, 128 tokens, with no speculation and with suffix (adaptive).

Both settings run on the same engines (``logits_processing.CANDIDATES`` set
before each run: 256, or past the vocabulary for the full sort), alternating
their order round by round (``harness.rounds``); each figure is the median over
rounds of output tokens / wall seconds, the speedup the median of per-round
ratios with the min-max spread.

    /tmp/q/bench python benchmarks/sampling_filter_bench.py
"""

from __future__ import annotations

from typing import Any

from spec_cost_bench import CHAT, proposer

import harness

SETTINGS = {"full_sort": 1 << 30, "candidates": 256}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "sampling_filter.json", repeats=5,
                            dtype="bfloat16", threads=2)
    ap.add_argument("--prompts", type=int, default=2)
    args = ap.parse_args()
    bench = harness.start("sampling_filter", args)
    from speculant import LLM, SamplingParams
    from speculant.sampling import logits_processing

    llms = {}
    for name in ("none", "suffix"):
        llms[name] = LLM.from_dict({"model": {"path": harness.smollm2_path(), "dtype": args.dtype,
                                              "quantization": "dequantize"}, "cache": {"memory_gb": 0.25},
                                    "speculative": {} if name == "none" else proposer(name)})
        harness.warm_up(llms[name], chat=True)
    convs = [[{"role": "user", "content": c}] for c in CHAT[:args.prompts]]

    def run_one(config: str) -> dict[str, Any]:
        engine, setting = config.split("/")
        logits_processing.CANDIDATES = SETTINGS[setting]
        tokens, seconds = 0, 0.0
        for i, conv in enumerate(convs):
            out = llms[engine].chat([conv], SamplingParams(temperature=1.0, top_p=0.95, max_tokens=128, seed=i,
                                                           ignore_eos=True), use_tqdm=False)
            tokens += len(out[0].outputs[0].token_ids)
            seconds += llms[engine].last_run_seconds
        return {"tok_per_s": tokens / seconds}

    names = [f"{e}/{s}" for e in llms for s in SETTINGS]
    runs = harness.rounds(names, args.repeats, run_one, describe=lambda r: f"{r['tok_per_s']:.1f} tok/s")
    rows = {}
    for name in names:
        engine, _ = name.split("/")
        rows[name] = {"tok_per_s": harness.summary([r["tok_per_s"] for r in runs[name]], 2),
                      "speedup_vs_full_sort": harness.summary(
                          harness.per_round_ratios(runs, name, f"{engine}/full_sort", "tok_per_s"), 4)}
        bench.log(f"{name}: {rows[name]['tok_per_s']['median']:.1f} tok/s, "
                  f"x{rows[name]['speedup_vs_full_sort']['median']:.3f}")
    bench.write({"model": f"SmolLM2-135M-Instruct ({args.dtype})", "prompts": args.prompts, "max_tokens": 128,
                 "candidates": SETTINGS["candidates"], "rows": rows})


if __name__ == "__main__":
    main()
