"""The result tables of the docs, generated from ``benchmarks/results/*.json``.

``python -m speculant.bench.docs`` rewrites every block between
``<!-- results:NAME:start -->`` and ``<!-- results:NAME:end -->`` in
README.md and docs/benchmarks.md; ``--check`` only reports stale blocks
(exit 1), which is what the test suite runs. Every row names the machine,
date and commit its file was measured on (``commit not recorded`` for files
written before benchmarks recorded it), so a figure can't drift from its
source or lose its label.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md")

Table = Callable[[Path], list[str]]


def _load(results: Path, name: str) -> dict[str, Any] | None:
    path = results / name
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def measured_on(data: dict[str, Any]) -> str:
    """``machine, date time UTC, commit`` from a result file's environment."""
    env = data.get("env") or data.get("environment") or {}
    machine = env.get("gpu") or env.get("cpu") or "machine not recorded"
    date = str(env["date_utc"])[:16].replace("T", " ") if env.get("date_utc") else "date not recorded"
    commit = str(env.get("git_commit") or "")
    commit = commit[:7] + ("+dirty" if commit.endswith("-dirty") else "") if commit else "commit not recorded"
    return f"{machine}, {date} UTC, {commit}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def smollm2_batch1(results: Path) -> list[str]:
    """`speculant bench` on SmolLM2-135M-Instruct, one request at a time."""
    data = _load(results, "bench_smollm2_proposers.json")
    if data is None:
        return []
    rows = [r for r in data["rows"] if r.get("concurrency") == 1 and r.get("status") == "ok"]
    base = next(r["tokens_per_s"] for r in rows if r["engine"] == "speculant" and r["method"] == "no_spec")
    s = data["settings"]
    out = [f"SmolLM2-135M-Instruct, {s['dtype']}, {s['num_prompts']} chat prompts × {s['max_tokens']} tokens, "
           f"k = {s['k']}, greedy, batch 1, median of {s['repeats']} rounds; measured on {measured_on(data)}.", "",
           "| engine | method | tok/s | vs Speculant without speculation | tokens per verify step | "
           "output = no speculation |", "|---|---|---|---|---|---|"]
    for r in rows:
        same = {True: "yes", False: "**no**", None: "–"}[r.get("matches_no_spec")]
        out.append(f"| {r['engine']} | {r['method']} | {_num(r['tokens_per_s'])} | {_x(r['tokens_per_s'] / base)} | "
                   f"{_num(r.get('mean_accepted_length'), 2)} | {same} |")
    return out


def eagle_rounds(results: Path) -> list[str]:
    """``benchmarks/eagle_bench.py``: the EAGLE head, chunked and not."""
    data = _load(results, "eagle_smollm2.json")
    if data is None:
        return []
    s = data["settings"]
    out = [f"EAGLE head on SmolLM2-135M-Instruct, {s['dtype']}, {s['prompts']} prompts × {s['max_tokens']} tokens, "
           f"k = {s['k']}, {s['repeats']} rounds; measured on {measured_on(data)}.", "",
           "| configuration | tok/s | speedup | tokens per verify step | chunked ÷ unchunked (median of rounds) |",
           "|---|---|---|---|---|"]
    for name, r in data["results"].items():
        out.append(f"| {name} | {_num(r['tokens_per_s'])} | {_x(r.get('speedup_vs_no_spec'))} | "
                   f"{_num(r.get('tokens_per_verify_step'), 2)} | {_num(r.get('vs_unchunked_median_of_rounds'), 3)} |")
    return out


def heldout_acceptance(results: Path) -> list[str]:
    """``benchmarks/heldout_acceptance.py``: tokens per verify step on held-out chat prompts."""
    data = _load(results, "heldout_tokens_per_step_smollm2.json")
    if data is None:
        return []
    out = [f"Tokens per verify step on the 20 held-out chat prompts (greedy); measured on {measured_on(data)}.", "",
           "| proposer | tokens per verify step | acceptance rate | output = no speculation |", "|---|---|---|---|"]
    for name, r in sorted(data["results"].items(), key=lambda kv: -kv[1]["tokens_per_verify_step"]):
        out.append(f"| {name} | {r['tokens_per_verify_step']:.2f} | {r['acceptance_rate']:.2f} | "
                   f"{'yes' if r['identical_to_no_spec'] else '**no**'} |")
    return out


def _gpu_files(results: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(results.glob("gpu_bench_*.json"))]


def _with_baseline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``data``'s rows that ran, each with ``vs_baseline``: its tokens/s over Speculant's
    no-speculation row at the same concurrency (what ``--random-llama`` files already hold)."""
    rows = [r for r in data["rows"] if r.get("status") == "ok"]
    base = {r["concurrency"]: r["tokens_per_s"] for r in rows
            if r["engine"] == "speculant" and r["method"] == "no_spec"}
    for r in rows:
        if r.get("vs_baseline") is None and base.get(r["concurrency"]):
            r["vs_baseline"] = r["tokens_per_s"] / base[r["concurrency"]]
    return rows


def _title(data: dict[str, Any]) -> str:
    if "title" in data:
        return str(data["title"])
    s = data["settings"]
    return (f"{Path(str(s['target'])).name}, {s['dtype']}, {s['num_prompts']} chat prompts × {s['max_tokens']} "
            f"tokens, k = {s['k']}, greedy, {s.get('device', 'cpu')}")


def gpu_rows(results: Path) -> list[str]:
    """``scripts/gpu_check.sh``'s bench rows on the GPU (``gpu_bench_*.json``), one table per file."""
    out: list[str] = []
    for name, data in _gpu_files(results):
        out += [f"`{name}`: {_title(data)}; measured on {measured_on(data)}.", "",
                "| engine | method | batch | tok/s | vs Speculant without speculation | tokens per verify step | "
                "output = no speculation | peak GPU GB |", "|---|---|---|---|---|---|---|---|"]
        for r in _with_baseline(data):
            same = {True: "yes", False: "no", None: "–"}[r.get("matches_no_spec")]
            out.append(f"| {r['engine']} | {r['method']} | {r.get('concurrency', 1)} | {_num(r.get('tokens_per_s'))} "
                       f"| {_x(r.get('vs_baseline'))} | {_num(r.get('mean_accepted_length'), 2)} | {same} | "
                       f"{_num(r.get('peak_gpu_memory_gb'), 2)} |")
        out.append("")
    return out[:-1] if out else out


def gpu_headline(results: Path) -> list[str]:
    """One README line per GPU file: Speculant against its reference in that file."""
    out = []
    for _name, data in _gpu_files(results):
        rows = _with_baseline(data)
        on = measured_on(data)
        spec = {(r["engine"], r["method"]): r for r in rows}
        base = spec.get(("speculant", "no_spec"))
        oracle = [r for r in rows if r["method"].startswith("oracle")]
        if oracle and base:
            r = oracle[0]
            out.append(f"| {_title(data).split(',')[0]}, `{r['method']}`, batch 1 | {r['vs_baseline']:.2f}× no "
                       f"speculation ({base['tokens_per_s']:.1f} → {r['tokens_per_s']:.1f} tok/s, "
                       f"{r['mean_accepted_length']:.2f} tokens per verify step) | {on} | "
                       f"[gpu](docs/benchmarks.md#results-gpu) |")
            continue
        hf = spec.get(("transformers", "generate"))
        if base and hf:
            c = base["concurrency"]
            what = "batch 1" if c == 1 else f"{c} concurrent requests (transformers: one static padded batch)"
            out.append(f"| {_title(data).split(',')[0]} {data['settings']['dtype']} on the GPU, {what}, no "
                       f"speculation vs transformers `generate()` | {base['tokens_per_s']:.0f} vs "
                       f"{hf['tokens_per_s']:.0f} tok/s ({base['tokens_per_s'] / hf['tokens_per_s']:.2f}×) | {on} | "
                       f"[gpu](docs/benchmarks.md#results-gpu) |")
    return out


def headline(results: Path) -> list[str]:
    """The README's short table: one line per claim, each with its source."""
    out = ["| result | figure | measured on | details |", "|---|---|---|---|"]
    data = _load(results, "bench_smollm2_proposers.json")
    if data is not None:
        rows = {(r["engine"], r["method"]): r for r in data["rows"]
                if r.get("concurrency") == 1 and r.get("status") == "ok"}
        base = rows[("speculant", "no_spec")]["tokens_per_s"]
        hf = rows.get(("transformers", "generate"))
        if hf:
            out.append(f"| SmolLM2-135M fp32, batch 1, no speculation vs transformers `generate()` | "
                       f"{base:.1f} vs {hf['tokens_per_s']:.1f} tok/s ({base / hf['tokens_per_s']:.2f}×) | "
                       f"{measured_on(data)} | [bench](docs/benchmarks.md#results-smollm2-batch-1) |")
        spec = [r for (e, m), r in rows.items() if e == "speculant" and m != "no_spec"]
        best = max(spec, key=lambda r: r["tokens_per_s"])
        out.append(f"| best speculative row, same run (`{best['method']}`) | {best['tokens_per_s'] / base:.2f}× "
                   f"({best['mean_accepted_length']:.2f} tokens per verify step), output identical | "
                   f"{measured_on(data)} | [bench](docs/benchmarks.md#results-smollm2-batch-1) |")
    data = _load(results, "eagle_smollm2.json")
    if data is not None:
        for name in ("eagle", "eagle_suffix"):
            r = data["results"].get(name)
            if r:
                out.append(f"| `{name}` on SmolLM2 (eagle_bench, 2 prompts) | {r['speedup_vs_no_spec']:.2f}× "
                           f"({r['tokens_per_verify_step']:.2f} tokens per verify step) | {measured_on(data)} | "
                           f"[eagle](docs/benchmarks.md#results-eagle) |")
    return out + gpu_headline(results) + graphs_headline(results)


def graphs(results: Path) -> list[str]:
    """CUDA graphs against eager forwards on the GPU (``python -m speculant.bench.graph_check``)."""
    data = _load(results, "gpu_graph_check.json")
    if data is None:
        return []
    out = [f"A {data['size']}-parameter-shaped llama with dummy weights, batch 1, greedy; measured on "
           f"{measured_on(data)}.", "",
           "| dtype | speculation | eager ms / step | graphed ms / step | speedup | graphs | output |",
           "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "graphed_ms_per_decode_step" not in r:
            out.append(f"| {r['dtype']} | {r['speculation']} | – | – | – | – | {r.get('error', 'failed')} |")
            continue
        same = "identical" if r["identical"] else ("near tie only" if r["ok"] else "**differs**")
        out.append(f"| {r['dtype']} | {r['speculation']} | {r['eager_ms_per_decode_step']:.2f} | "
                   f"{r['graphed_ms_per_decode_step']:.2f} | "
                   f"{r['eager_ms_per_decode_step'] / r['graphed_ms_per_decode_step']:.1f}× | "
                   f"{len(r['graph_keys'])} | {same} |")
    return out


def graphs_headline(results: Path) -> list[str]:
    data = _load(results, "gpu_graph_check.json")
    rows = [r for r in (data or {}).get("rows", []) if r.get("speculation") == "none" and "graph_keys" in r]
    return [f"| CUDA graphs, {r['dtype']} batch-1 decode step (135M-shaped llama) | "
            f"{r['eager_ms_per_decode_step']:.1f} → {r['graphed_ms_per_decode_step']:.1f} ms "
            f"({r['eager_ms_per_decode_step'] / r['graphed_ms_per_decode_step']:.1f}×), "
            f"{'output identical' if r['identical'] else 'near ties only'} | {measured_on(data or {})} | "
            f"[graphs](docs/benchmarks.md#results-graphs) |" for r in rows]


BLOCKS: dict[str, Table] = {
    "headline": headline,
    "smollm2-batch-1": smollm2_batch1,
    "eagle": eagle_rounds,
    "heldout": heldout_acceptance,
    "gpu": gpu_rows,
    "graphs": graphs,
}
"""Block name -> the function that renders it. docs/benchmarks.md holds a
``tables`` block that gathers every block but the headline, each under its
own heading (anchors ``results-<name>``)."""


def render(results: Path = RESULTS) -> dict[str, str]:
    """Every block's generated text (without its markers)."""
    blocks = {name: "\n".join(fn(results)) for name, fn in BLOCKS.items()}
    parts = []
    for name, text in blocks.items():
        if name != "headline" and text:
            doc = (BLOCKS[name].__doc__ or name).strip().splitlines()[0]
            parts.append(f'<a id="results-{name}"></a>\n**{doc}**\n\n{text}')
    blocks["tables"] = "\n\n".join(parts)
    return blocks


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- results:{name}:start -->", f"<!-- results:{name}:end -->"


def apply(text: str, blocks: dict[str, str]) -> str:
    """``text`` with every results block it has marked replaced by the generated one."""
    for name, body in blocks.items():
        start, end = _markers(name)
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        block = f"{start}\n{body}\n{end}" if body else f"{start}\n{end}"
        text = pattern.sub(lambda _m: block, text)  # noqa: B023 - used at once, within this iteration
    return text


def stale_files(paths: tuple[Path, ...] = DOCS, results: Path = RESULTS) -> list[Path]:
    """The docs whose generated blocks differ from what ``results`` gives."""
    blocks = render(results)
    return [p for p in paths if apply(p.read_text(encoding="utf-8"), blocks) != p.read_text(encoding="utf-8")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speculant.bench.docs", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report stale blocks (exit 1 if any)")
    args = ap.parse_args(argv)
    stale = stale_files()
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)}: generated result tables are stale; run python -m speculant.bench.docs")
        return 1 if stale else 0
    blocks = render()
    for p in stale:
        p.write_text(apply(p.read_text(encoding="utf-8"), blocks), encoding="utf-8")
        print(f"updated {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
