"""The table of ``benchmarks/engine_loop_gate.py``: this code against the
commit before the one engine loop (issue 48's speed gate: within 2%)."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, markdown_table, measured_on

LABELS = {"bs1": "batch 1 (wall clock)", "c32": "32 requests (wall clock)",
          "bs1_cpu": "batch 1 (per CPU second)", "c32_cpu": "32 requests (per CPU second)"}


def engine_loop_gate(results: Path) -> list[str]:
    """The engine-loop speed gate: SmolLM2 bf16, this code against the commit before the loop"""
    data = _load(results, "engine_loop_gate.json")
    if data is None:
        return []
    opts, env = data["options"], data.get("environment") or {}
    load = env.get("load_avg")
    intro = (f"Greedy, {opts['num_prompts']} chat edit prompts: batch 1 streamed ({opts['max_tokens']} tokens "
             f"each), and 32 requests at once ({opts['max_tokens_c32']} tokens each); {opts['repeats']} alternating "
             f"rounds, {opts['threads']} thread(s) per worker; base {data['base']['path']}; measured on "
             f"{measured_on(data)}; load average at the start {load[0] if load else '?'} on 2 cores (read the spread).")
    header = ["workload", "base tok/s (median)", "branch tok/s (median)",
              "branch / base per round: median (min-max)", "same tokens"]
    rows = []
    for key, label in LABELS.items():
        r = data["results"].get(key)
        if r is not None:
            tps, ratio = r["tokens_per_s"], r["branch_over_base"]
            rows.append([label, f"{tps['base']:.1f}", f"{tps['branch']:.1f}",
                         f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})",
                         "yes" if r["same_tokens"] else "**no**"])
    return markdown_table(intro, header, rows)
