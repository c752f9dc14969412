"""Token trees against the best chain (issue 52): bs = 1, edit prompts, alternating rounds.

Rows: ``none``; ``chain_k{K}`` (fixed, ``--chain-ks``); ``chain_adaptive`` (k =
``--depth``); ``tree_adaptive`` (width ``--width``, ``--nodes`` nodes, depth
``--depth``, shapes from ``engine/tree_shape.py``); ``tree_fixed`` (whole trees,
``--fixed-tree``). Per row: tok/s, per-round ratios to ``none`` and to the best
chain (highest median tok/s), tokens per verify step, acceptance, the planned
shapes and whether greedy output equals ``none``'s. ``--temperature`` > 0: a
seeded sampled row (outputs differ by design).

    /tmp/q/bench python benchmarks/tree_bench.py --proposer suffix --out benchmarks/results/trees_smollm2_suffix.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness
from repeated_tasks import conversations

QWEN_Q4KM = Path.home() / ".cache" / "speculant" / "gguf" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def proposer(name: str) -> dict[str, Any]:
    if name == "ngram":
        return {"proposer": "ngram", "proposer_options": {"min_n": 2, "max_n": 4}}
    if name == "suffix":
        return {"proposer": "suffix"}
    raise SystemExit(f"--proposer {name!r}: pick ngram or suffix (the built-ins that propose trees)")


def configs(args) -> dict[str, dict[str, Any] | None]:
    p = proposer(args.proposer)
    fixed = {"policy": "fixed"}
    tree = {**p, "num_speculative_tokens": args.depth, "tree_width": args.width, "max_tree_tokens": args.nodes}
    out: dict[str, dict[str, Any] | None] = {"none": None}
    for k in (int(x) for x in args.chain_ks.split(",") if x):
        out[f"chain_k{k}"] = {**p, "num_speculative_tokens": k, "draft_length": fixed}
    out["chain_adaptive"] = {**p, "num_speculative_tokens": args.depth}
    out["tree_adaptive"] = tree
    if args.fixed_tree:
        out["tree_fixed"] = {**tree, "draft_length": fixed}
    return out


def run_one(llm, convs, params) -> dict[str, Any]:
    llm.engine.reset_metrics()
    outs, seconds = [], 0.0
    for i, conv in enumerate(convs):
        outs += llm.chat([conv], params[i], use_tqdm=False)
        seconds += llm.last_run_seconds
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    m = llm.get_metrics()
    return {"tok_per_s": sum(len(t) for t in tokens) / seconds, "tokens": tokens,
            "hist": m.get("accepted_length_histogram", []), "num_draft_tokens": m.get("num_draft_tokens", 0),
            "num_accepted_tokens": m.get("num_accepted_tokens", 0),
            "tree": {k: m[k] for k in ("mean_planned_tree_nodes", "planned_branching_fraction",
                                       "mean_verified_tree_nodes", "verified_branching_fraction") if k in m},
            "cost_curve": m.get("cost_curve")}


def spread(values: list[float], digits: int = 4) -> dict[str, float]:
    return {k: round(f(values), digits) for k, f in (("median", harness.median), ("min", min), ("max", max))}


def summed_hist(rs: list[dict[str, Any]]) -> list[int]:
    hist: list[int] = []
    for r in rs:
        for a, n in enumerate(r["hist"]):
            hist += [0] * (a + 1 - len(hist))
            hist[a] += n
    return hist


def tokens_per_step(hist: list[int]) -> float | None:
    steps = sum(hist)
    return round(sum((a + 1) * n for a, n in enumerate(hist)) / steps, 4) if steps else None


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "trees.json", repeats=5, dtype="bfloat16", threads=2)
    ap.add_argument("--proposer", default="suffix")
    ap.add_argument("--model", choices=["smollm2", "qwen-1.5b-q4km"], default="smollm2")
    ap.add_argument("--chain-ks", default="4,8", help="fixed chain lengths (comma-separated)")
    ap.add_argument("--depth", type=int, default=8, help="num_speculative_tokens of the adaptive and tree rows")
    ap.add_argument("--width", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--fixed-tree", action="store_true")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4, help="edit requests per run (at most 4)")
    args = ap.parse_args()
    bench = harness.start("tree_bench", args)
    from speculant import LLM, SamplingParams

    cfgs = configs(args)
    convs = conversations("edit")[:args.prompts]
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=i)
              for i in range(len(convs))]
    model = ({"path": harness.smollm2_path(), "dtype": args.dtype, "quantization": "dequantize"}
             if args.model == "smollm2" else {"path": str(QWEN_Q4KM), "dtype": args.dtype, "quantization": "gguf"})
    llms = {}
    for name, spec in cfgs.items():
        llms[name] = LLM.from_dict({"model": model, "cache": {"memory_gb": 0.25}, "speculative": spec or {}})
        harness.warm_up(llms[name], chat=True)
        bench.log(f"loaded {name}")
    runs = harness.rounds(list(cfgs), args.repeats, lambda n: run_one(llms[n], convs, params),
                          describe=lambda r: f"{r['tok_per_s']:.2f} tok/s")
    med = harness.medians(runs, "tok_per_s")
    chains = [n for n in cfgs if n.startswith("chain")]
    best_chain = max(chains, key=lambda n: med[n])
    reference = runs["none"][0]["tokens"]
    rows = {}
    for name, rs in runs.items():
        hist = summed_hist(rs)
        last = rs[-1]
        rows[name] = {
            "tok_per_s": spread([r["tok_per_s"] for r in rs], 2),
            "speedup_vs_none": spread(harness.per_round_ratios(runs, name, "none", "tok_per_s")),
            "vs_best_chain": spread(harness.per_round_ratios(runs, name, best_chain, "tok_per_s")),
            "tokens_per_verify_step": tokens_per_step(hist), "accepted_length_histogram": hist,
            "acceptance_rate": round(sum(r["num_accepted_tokens"] for r in rs)
                                     / max(1, sum(r["num_draft_tokens"] for r in rs)), 4),
            "outputs_equal_none": all(r["tokens"] == reference for r in rs),
            **{k: round(v, 4) for k, v in last["tree"].items()}}
        s = rows[name]["speedup_vs_none"]
        bench.log(f"{name:>16}: {med[name]:7.2f} tok/s, x{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) vs none, "
                  f"x{rows[name]['vs_best_chain']['median']:.3f} vs {best_chain}, "
                  f"{rows[name]['tokens_per_verify_step']} tokens/verify step, same as none: "
                  f"{rows[name]['outputs_equal_none']}, tree: {last['tree']}")
    for name in rows:
        tps, base = rows[name]["tokens_per_verify_step"], rows[best_chain]["tokens_per_verify_step"]
        rows[name]["tokens_per_step_vs_best_chain"] = round(tps / base, 4) if tps and base else None
    bench.write({"model": ("SmolLM2-135M-Instruct" if args.model == "smollm2" else "Qwen2.5-Coder-1.5B-Instruct "
                           "Q4_K_M (GGUF blocks)") + f" ({args.dtype})",
                 "prompts": len(convs), "best_chain": best_chain, "cost_curve": curve(runs), "rows": rows})


def curve(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """t(n)/t(1) the adaptive rows priced with (measured at load, the same for every engine of the run)."""
    c = next((rs[-1]["cost_curve"] for rs in runs.values() if rs[-1].get("cost_curve")), None)
    return None if c is None else {"sizes": c["sizes"], "ratios": [round(r, 3) for r in c["ratios"]],
                                   "t1_ms": round(1e3 * c["t1_s"], 3) if c.get("t1_s") else None}


if __name__ == "__main__":
    main()
