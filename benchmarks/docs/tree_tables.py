"""The table of ``benchmarks/tree_bench.py``: token trees (adaptive shapes)
against the best chain, per proposer and model (issue 52)."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, markdown_table, measured_on

HEADER = ("row", "tok/s (median)", "vs none (min-max)", "vs best chain (min-max)", "tokens per verify step "
          "(vs best chain)", "acceptance", "same output as none",
          "adaptive trees verified: mean nodes, share branching")


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
        planned = (f"{r['mean_verified_tree_nodes']:.1f}, {r['verified_branching_fraction']:.0%}"
                   if "mean_verified_tree_nodes" in r else  # results from before prune chose among offered nodes
                   f"{r['mean_planned_tree_nodes']:.1f}, {r['planned_branching_fraction']:.0%} (planned)"
                   if "mean_planned_tree_nodes" in r else "-")
        same = "n/a (sampled)" if sampled else "yes" if r["outputs_equal_none"] else "**no**"
        rows.append((name, f"{r['tok_per_s']['median']:.1f}", _ratio(r["speedup_vs_none"]),
                     _ratio(r["vs_best_chain"]), f"{tps:.2f} ({vs:.2f}x)" if tps and vs else "-",
                     f"{r['acceptance_rate']:.2f}" if name != "none" else "-", same, planned))
    return markdown_table(intro, HEADER, rows)


STAGES = ("plan", "propose", "prune", "forward", "accept", "compact", "commit_plan", "rest")


def tree_step_profile(results: Path) -> list[str]:
    """Where a tree step's time goes, against a chain step (``benchmarks/tree_step_profile.py``)."""
    out: list[str] = []
    for path in sorted(results.glob("tree_step_profile_*.json")):
        data = _load(results, path.name)
        if data is None:
            continue
        env, o = data.get("environment") or {}, data["options"]
        load = env.get("load_avg")
        intro = (f"{data['model']}, proposer {o['proposer']}, greedy, {data['prompts']} edit prompts x "
                 f"{o['max_tokens']} tokens one at a time, {o['repeats']} alternating rounds, {o['threads']} "
                 f"threads; trees: width {o['width']}, at most {o['nodes']} nodes, depth {o['depth']}. Per verify "
                 f"step of decodes alone, medians over rounds, in ms; 'rest' is the engine's Python around the "
                 "stages (scheduling and the proposer's commit, under 0.05 ms, are left out). "
                 f"Measured on {measured_on(data)}; load average at the start {load[0] if load else '?'} "
                 "on 2 cores.")
        rows = []
        for name, r in data["rows"].items():
            ms, sp = r["stage_ms"], r["step_ms"]
            fwd = ", ".join(f"{n}: {v:.1f}" for n, v in r["forward_ms_by_rows"].items())
            rows.append((name, f"{sp['median']:.2f} ({sp['min']:.2f}-{sp['max']:.2f})", f"{r['rows_per_step']:.1f}",
                         f"{r['tokens_per_step']:.2f}", *(f"{ms[k]:.2f}" for k in STAGES), fwd))
        out += markdown_table(intro, ("row", "step ms (min-max)", "forward rows", "tokens/step", *STAGES,
                                      "forward ms by rows (last round)"), rows) + [""]
    return out[:-1]
