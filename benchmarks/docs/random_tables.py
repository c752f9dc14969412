"""The docs table of ``speculant bench --random-llama`` runs on the CPU.

Each ``benchmarks/results/random_llama_*.json`` file is one run: Speculant
without speculation, with the oracle proposer at each acceptance asked for,
and transformers' ``generate()`` on the same random weights (same config and
seed), side by side in one process.
"""

from __future__ import annotations

import json
from pathlib import Path

from .tables import _num, _x, measured_on


def random_llama(results: Path) -> list[str]:
    """Random-weight llama targets at the sizes people speculate on, against transformers on the same weights."""
    out: list[str] = []
    for path in sorted(results.glob("random_llama_*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out += [f"`{path.name}`: {data['title']}; measured on {measured_on(data)}.", "",
                "| engine | method | batch | tok/s | vs Speculant without speculation | vs transformers | "
                "tokens per verify step |", "|---|---|---|---|---|---|---|"]
        for r in data["rows"]:
            if r.get("status") != "ok":
                out.append(f"| {r['engine']} | {r['method']} | {r.get('concurrency', 1)} | {r['status']} "
                           f"| – | – | – |")
                continue
            vs_hf = 1.0 if r["engine"] == "transformers" else r.get("vs_transformers")
            out.append(f"| {r['engine']} | {r['method']} | {r.get('concurrency', 1)} "
                       f"| {_num(r.get('tokens_per_s'))} | {_x(r.get('vs_baseline'))} | {_x(vs_hf)} "
                       f"| {_num(r.get('mean_accepted_length'), 2)} |")
        out.append("")
    return out[:-1] if out else out
