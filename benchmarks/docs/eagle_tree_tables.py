"""The table of ``benchmarks/eagle_tree_bench.py``: EAGLE token trees against
the EAGLE chain on SmolLM2 in bf16 (issue 52)."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, markdown_table, measured_on


def eagle_trees(results: Path) -> list[str]:
    """EAGLE trees vs the EAGLE chain, greedy, one request at a time."""
    data = _load(results, "eagle_trees_smollm2.json")
    if data is None:
        return []
    s = data["settings"]
    load = (data.get("environment") or data.get("env") or {}).get("load_avg")
    same = "yes" if data["greedy_outputs_identical"] else "**no**"
    intro = (f"SmolLM2-135M-Instruct, {s['dtype']} (the GGUF dequantized), the shipped EAGLE head, "
             f"{s['prompts']} held-out chat prompts x {s['max_tokens']} tokens, greedy, batch size 1, fixed draft "
             f"length, {s['repeats']} alternating rounds (tree_wW_nN_dD: tree_width W, max_tree_tokens N, "
             f"depth D); greedy output identical to no speculation: {same}; measured on {measured_on(data)}; "
             f"load average at the start {load[0] if load else '?'} on 2 cores.")
    rows = [[name, f"{r['tokens_per_s']:.1f}", f"{r.get('tokens_per_verify_step', 1.0):.2f}",
             f"{r['tok_s_vs_chain']:.3f} ({min(r['tok_s_vs_chain_per_round']):.3f}-"
             f"{max(r['tok_s_vs_chain_per_round']):.3f})", f"{r['tok_s_vs_no_spec']:.3f}",
             f"{r['propose_s']:.2f}", f"{r['score_s']:.2f}"]
            for name, r in data["results"].items()]
    return markdown_table(intro, ["configuration", "tok/s (median)", "tokens per verify step",
                                  "tok/s vs chain: median (min-max) per round", "tok/s vs no speculation",
                                  "propose s", "score s"], rows)
