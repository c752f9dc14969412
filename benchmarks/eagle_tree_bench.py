"""EAGLE token trees against the EAGLE chain on SmolLM2-135M-Instruct in bf16.

The GGUF's weights dequantized to bfloat16 (``model.quantization =
"dequantize"``), the shipped head (models/smollm2-eagle), held-out chat
prompts rendered with the chat template, batch size 1, greedy, ``--max-tokens``
new tokens (EOS ignored). Configurations: no speculation, the EAGLE chain at
k = ``--k`` and EAGLE trees of each ``--trees`` shape (``width:nodes:depth``),
all with the fixed draft length (so the shapes are what is measured, not the
adaptive policy's choices). Each configuration is loaded once and run once per
round over ``--repeats`` alternating rounds (``harness.rounds``); each figure is
the median over rounds, each tree row's ratio to the chain is taken round by
round. Greedy outputs are checked identical to no speculation.

    /tmp/q/bench python benchmarks/eagle_tree_bench.py --out benchmarks/results/eagle_trees_smollm2.json
"""

from __future__ import annotations

from eagle_bench import HELDOUT, chat_rounds, median_of

import harness
from speculant import LLM, SamplingParams


def build(args, spec: dict | None) -> LLM:
    return LLM.from_dict({"model": {"path": args.target, "dtype": args.dtype, "quantization": "dequantize"},
                          "scheduler": {"max_num_seqs": 1, "max_num_batched_tokens": 512},
                          "cache": {"memory_gb": 0.25, "enable_prefix_caching": False},
                          "speculative": spec or {}})


def configs(args) -> dict[str, dict | None]:
    eagle = {"proposer": "eagle", "proposer_options": {"path": args.head}, "draft_length": {"policy": "fixed"}}
    out: dict[str, dict | None] = {"no_spec": None, f"chain_k{args.k}": {**eagle, "num_speculative_tokens": args.k}}
    for shape in args.trees.split(","):
        width, nodes, depth = (int(x) for x in shape.split(":"))
        out[f"tree_w{width}_n{nodes}_d{depth}"] = {**eagle, "num_speculative_tokens": depth, "tree_width": width,
                                                   "max_tree_tokens": nodes}
    return out


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "eagle_trees_smollm2.json", repeats=5,
                            dtype="bfloat16")
    ap.add_argument("--head", default="models/smollm2-eagle")
    ap.add_argument("--k", type=int, default=4, help="the chain's proposals per step")
    ap.add_argument("--trees", default="2:8:4,4:16:5", help="tree shapes, width:nodes:depth, comma-separated")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    args.target = harness.smollm2_path()
    prompts = HELDOUT[:args.prompts]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    cfgs = configs(args)
    bench = harness.start("eagle_trees_smollm2", args)
    llms = {name: build(args, spec) for name, spec in cfgs.items()}
    runs, outputs = chat_rounds(llms, args.repeats, prompts, params)
    results = {n: median_of(rs) for n, rs in runs.items()}
    chain = f"chain_k{args.k}"
    for name in results:
        ratios = harness.per_round_ratios(runs, name, chain, "tokens_per_s")
        results[name]["tok_s_vs_chain_per_round"] = [round(x, 3) for x in ratios]
        results[name]["tok_s_vs_chain"] = round(harness.median(ratios), 3)
        results[name]["tok_s_vs_no_spec"] = round(harness.median(
            harness.per_round_ratios(runs, name, "no_spec", "tokens_per_s")), 3)
    identical = all(outputs[n] == outputs["no_spec"] for n in cfgs)
    bench.write({"target": args.target, "head": args.head,
                 "settings": {"dtype": args.dtype, "k": args.k, "trees": args.trees, "prompts": len(prompts),
                              "max_tokens": args.max_tokens, "repeats": args.repeats, "batch_size": 1,
                              "greedy": True, "draft_length": "fixed"},
                 "greedy_outputs_identical": identical, "results": results})
    rows = [[n, f"{r['tokens_per_s']:.1f}", f"{min(r['tok_s_vs_chain_per_round']):.2f}-"
             f"{max(r['tok_s_vs_chain_per_round']):.2f}", f"{r['tok_s_vs_chain']:.2f}",
             f"{r.get('tokens_per_verify_step', 1.0):.2f}"] for n, r in results.items()]
    print(f"{bench.env['cpu']}, {bench.env['date_utc'][:10]}, {args.dtype}, outputs identical: {identical}")
    print(harness.markdown_table(["config", "tok/s", "vs chain per round (min-max)", "vs chain (median)",
                                  "tok/verify step"], rows))


if __name__ == "__main__":
    main()
