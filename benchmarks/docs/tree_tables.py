"""The table of ``benchmarks/tree_bench.py``: token trees (adaptive shapes)
against the best chain, per proposer and model (issue 52)."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, markdown_table, measured_on

HEADER = ("row", "tok/s (median)", "vs none (min-max)", "vs best chain (min-max)", "tokens per verify step "
          "(vs best chain)", "acceptance", "same output as none", "planned trees: mean nodes, share branching")


def trees(results: Path) -> list[str]:
    """Token trees vs the best chain: adaptive tree shapes from t(n)/t(1) (``benchmarks/tree_bench.py``)."""
    out: list[str] = []
    for path in sorted(results.glob("trees_*.json")):
        data = _load(results, path.name)
        if data is not None:
            out += _table(data) + [""]
    return out[:-1]


def _ratio(s: dict) -> str:
    return f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"


def _curve(data: dict) -> str:
    curve = data.get("cost_curve")
    if not curve:
        return "no cost curve recorded"
    points = dict(zip(curve["sizes"], curve["ratios"]))
    shown = ", ".join(f"t({n})/t(1) = {points[n]:.2f}" for n in (4, 8, 16) if n in points)
    return f"measured cost curve: {shown}"


def _table(data: dict) -> list[str]:
    env, o = data.get("environment") or {}, data["options"]
    load = env.get("load_avg")
    sampled = o["temperature"] > 0
    intro = (f"{data['model']}, proposer {o['proposer']}, "
             + (f"temperature {o['temperature']} (seeded; outputs differ from none by design)" if sampled
                else "greedy")
             + f", {data['prompts']} edit prompt(s) x {o['max_tokens']} tokens one at a time, "
             f"{o['repeats']} alternating rounds, {o['threads']} threads; trees: width {o['width']}, "
             f"at most {o['nodes']} nodes, depth {o['depth']}; best chain: {data['best_chain']}; "
             f"{_curve(data)}; measured on {measured_on(data)}; load average at the start "
             f"{load[0] if load else '?'} on 2 cores.")
    rows = []
    for name, r in data["rows"].items():
        tps, vs = r["tokens_per_verify_step"], r.get("tokens_per_step_vs_best_chain")
        planned = (f"{r['mean_planned_tree_nodes']:.1f}, {r['planned_branching_fraction']:.0%}"
                   if "mean_planned_tree_nodes" in r else "-")
        same = "n/a (sampled)" if sampled else "yes" if r["outputs_equal_none"] else "**no**"
        rows.append((name, f"{r['tok_per_s']['median']:.1f}", _ratio(r["speedup_vs_none"]),
                     _ratio(r["vs_best_chain"]), f"{tps:.2f} ({vs:.2f}x)" if tps and vs else "-",
                     f"{r['acceptance_rate']:.2f}" if name != "none" else "-", same, planned))
    return markdown_table(intro, HEADER, rows)
