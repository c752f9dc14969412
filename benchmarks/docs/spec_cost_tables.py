"""The table of ``benchmarks/spec_cost_bench.py``: speculation's cost under
the adaptive default against fixed k and no speculation (issue 50)."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, measured_on

WORKLOADS = {
    "chat": "open chat, temperature 1.0, top-p 0.95, one request at a time",
    "edits": "code edits, temperature 0, one request at a time",
    "mixed": "32 requests at once: 16 code edits at temperature 0, 16 open chats at temperature 1",
}


def spec_cost(results: Path) -> list[str]:
    """Speculation that never costs: the adaptive default vs fixed k vs none (``benchmarks/spec_cost_bench.py``)."""
    out: list[str] = []
    for workload, what in WORKLOADS.items():
        for path in sorted(results.glob(f"spec_cost_{workload}*.json")):  # one file per proposer run
            out += _table(what, workload, _load(results, path.name))
    return out


def _table(what: str, workload: str, data: dict | None) -> list[str]:
    if data is None:
        return []
    rows = data["rows"]
    base = next(iter(rows))
    load = (data.get("environment") or {}).get("load_avg")
    requests = "32 requests" if workload == "mixed" else f"{data.get('prompts', '')} prompt(s)"
    out = ["", f"{what}; {data['model']}, {requests} x {data['max_tokens']} tokens per run, "
               f"{data['options']['repeats']} alternating rounds, {data['options']['threads']} threads; measured on "
               f"{measured_on(data)}; load average at the start {load[0] if load else '?'} on 2 cores.", "",
           f"| configuration | tok/s (median) | vs {base}: median (min-max) | greedy output identical | "
           "accepted per verify step (0, 1, 2, ...) |",
           "|---|---|---|---|---|"]
    for name, r in rows.items():
        s = r[f"speedup_vs_{base}"]
        hist = " ".join(str(n) for n in r["accepted_length_histogram"]) or "-"
        same = "n/a (sampled)" if workload == "chat" else "yes" if r[f"greedy_tokens_equal_{base}"] else "**no**"
        out.append(f"| {name} | {r['tok_per_s']['median']:.1f} | {s['median']:.3f} ({s['min']:.3f}-"
                   f"{s['max']:.3f}) | {same} | {hist} |")
    if data.get("draft_model") and any(n.startswith("draft_model") for n in rows):
        out.append(f"- draft_model: {data['draft_model']}")
    return out


def sampling_filter(results: Path) -> list[str]:
    """Top-k / top-p among the most likely tokens vs a full sort (``benchmarks/sampling_filter_bench.py``)."""
    data = _load(results, "sampling_filter.json")
    if data is None:
        return []
    load = (data.get("environment") or {}).get("load_avg")
    out = [f"{data['model']}, open chat at temperature 1.0, top-p 0.95, {data['prompts']} prompt(s) x "
           f"{data['max_tokens']} tokens per run, one request at a time, {data['options']['repeats']} alternating "
           f"rounds, {data['options']['threads']} threads; the cut looked for among the {data['candidates']} most "
           f"likely tokens first; measured on {measured_on(data)}; load average at the start "
           f"{load[0] if load else '?'} on 2 cores.", "",
           "| engine / filter | tok/s (median) | vs the full sort: median (min-max) |", "|---|---|---|"]
    for name, r in data["rows"].items():
        s = r["speedup_vs_full_sort"]
        out.append(f"| {name} | {r['tok_per_s']['median']:.1f} | {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) |")
    return out
