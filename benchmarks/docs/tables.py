"""The tables ``benchmarks.docs`` renders: one function per block, each
reading its ``benchmarks/results`` file and returning Markdown lines (none when
the file is absent). Every table names the machine, date and commit measured on."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


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


def markdown_table(intro: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """``intro``, a blank line, then a Markdown table: ``header``'s columns and one line per row of cells."""
    return [intro, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


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
    return markdown_table(
        f"SmolLM2-135M-Instruct, {s['dtype']}, {s['num_prompts']} chat prompts × {s['max_tokens']} tokens, "
        f"k = {s['k']}, greedy, batch 1, median of {s['repeats']} rounds; measured on {measured_on(data)}.",
        ["engine", "method", "tok/s", "vs Speculant without speculation", "tokens per verify step",
         "output = no speculation"],
        ([r["engine"], r["method"], _num(r["tokens_per_s"]), _x(r["tokens_per_s"] / base),
          _num(r.get("mean_accepted_length"), 2), {True: "yes", False: "**no**", None: "–"}[r.get("matches_no_spec")]]
         for r in rows))


def eagle_rounds(results: Path) -> list[str]:
    """``benchmarks/eagle_bench.py``: the EAGLE head, chunked and not."""
    data = _load(results, "eagle_smollm2.json")
    if data is None:
        return []
    s = data["settings"]
    return markdown_table(
        f"EAGLE head on SmolLM2-135M-Instruct, {s['dtype']}, {s['prompts']} prompts × {s['max_tokens']} tokens, "
        f"k = {s['k']}, {s['repeats']} rounds; measured on {measured_on(data)}.",
        ["configuration", "tok/s", "speedup", "tokens per verify step", "chunked ÷ unchunked (median of rounds)"],
        ([name, _num(r["tokens_per_s"]), _x(r.get("speedup_vs_no_spec")), _num(r.get("tokens_per_verify_step"), 2),
          _num(r.get("vs_unchunked_median_of_rounds"), 3)] for name, r in data["results"].items()))


def heldout_acceptance(results: Path) -> list[str]:
    """``benchmarks/heldout_acceptance.py``: tokens per verify step on held-out chat prompts."""
    data = _load(results, "heldout_tokens_per_step_smollm2.json")
    if data is None:
        return []
    return markdown_table(
        f"Tokens per verify step on the 20 held-out chat prompts (greedy); measured on {measured_on(data)}.",
        ["proposer", "tokens per verify step", "acceptance rate", "output = no speculation"],
        ([name, f"{r['tokens_per_verify_step']:.2f}", f"{r['acceptance_rate']:.2f}",
          "yes" if r["identical_to_no_spec"] else "**no**"]
         for name, r in sorted(data["results"].items(), key=lambda kv: -kv[1]["tokens_per_verify_step"])))


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
        out += markdown_table(
            f"`{name}`: {_title(data)}; measured on {measured_on(data)}.",
            ["engine", "method", "batch", "tok/s", "vs Speculant without speculation", "tokens per verify step",
             "output = no speculation", "peak GPU GB"],
            ([r["engine"], r["method"], r.get("concurrency", 1), _num(r.get("tokens_per_s")), _x(r.get("vs_baseline")),
              _num(r.get("mean_accepted_length"), 2), {True: "yes", False: "no", None: "–"}[r.get("matches_no_spec")],
              _num(r.get("peak_gpu_memory_gb"), 2)] for r in _with_baseline(data)))
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


HEADLINE_HEADER = ["| result | figure | measured on | details |", "|---|---|---|---|"]


def smollm2_headline(results: Path) -> list[str]:
    """SmolLM2 at batch 1 without speculation against transformers ``generate()``."""
    data = _load(results, "bench_smollm2_proposers.json")
    if data is None:
        return []
    rows = {(r["engine"], r["method"]): r for r in data["rows"]
            if r.get("concurrency") == 1 and r.get("status") == "ok"}
    base = rows[("speculant", "no_spec")]["tokens_per_s"]
    hf = rows.get(("transformers", "generate"))
    if not hf:
        return []
    return [f"| SmolLM2-135M fp32, batch 1, no speculation vs transformers `generate()` | "
            f"{base:.1f} vs {hf['tokens_per_s']:.1f} tok/s ({base / hf['tokens_per_s']:.2f}×) | "
            f"{measured_on(data)} | [bench](docs/benchmarks.md#results-smollm2-batch-1) |"]


def eagle_headline(results: Path) -> list[str]:
    """The EAGLE head and its suffix hybrid on SmolLM2, in one line."""
    data = _load(results, "eagle_smollm2.json")
    if data is None:
        return []
    parts = [f"`{name}` {r['speedup_vs_no_spec']:.2f}× ({r['tokens_per_verify_step']:.2f} tokens per verify step)"
             for name in ("eagle", "eagle_suffix") if (r := data["results"].get(name))]
    if not parts:
        return []
    return [f"| EAGLE head on SmolLM2 vs no speculation (eagle_bench, {data['settings']['prompts']} prompts) | "
            f"{'; '.join(parts)} | {measured_on(data)} | [eagle](docs/benchmarks.md#results-eagle) |"]


def llamacpp(results: Path) -> list[str]:
    """Speculant against llama.cpp on the CPU (``benchmarks/llamacpp_compare.py``)."""
    data = _load(results, "llamacpp_compare.json")
    if data is None:
        return []
    w = data["workload"]
    return markdown_table(
        f"The chat prompts of examples/prompts/edit_tasks.txt, batch 1, greedy, EOS ignored, {w['max_tokens']} "
        f"new tokens, prefill included, {data['options'].get('threads')} threads, k = {w['k']}; measured on "
        f"{measured_on(data)}.",
        ["engine", "method", "dtype", "tok/s", "vs the faster llama.cpp row", "tokens per verify step"],
        ([r["engine"], r["method"], r["dtype"], f"{r['tokens_per_s']:.1f}", _x(r.get("vs_best_llamacpp")),
          _num(r.get("mean_accepted_length"), 2)] for r in data["rows"]))


def llamacpp_headline(results: Path) -> list[str]:
    data = _load(results, "llamacpp_compare.json")
    if data is None:
        return []
    rows = data["rows"]
    cpp = max((r for r in rows if r["engine"] == "llama.cpp"), key=lambda r: r["tokens_per_s"], default=None)
    plain = next((r for r in rows if r["engine"] == "speculant" and r["method"] == "no_spec"
                  and r["dtype"] == "bfloat16"), None)
    spec = max((r for r in rows if r["engine"] == "speculant" and r["method"] != "no_spec"),
               key=lambda r: r["tokens_per_s"], default=None)
    if not (cpp and plain and spec):
        return []
    return [f"| SmolLM2-135M on the CPU, batch 1: Speculant bf16 (no speculation / best speculative row, "
            f"`{spec['method']}`) vs llama.cpp | {plain['tokens_per_s']:.0f} / {spec['tokens_per_s']:.0f} vs "
            f"{cpp['tokens_per_s']:.0f} tok/s ({plain['tokens_per_s'] / cpp['tokens_per_s']:.2f}× / "
            f"{spec['tokens_per_s'] / cpp['tokens_per_s']:.2f}×) | {measured_on(data)} | "
            f"[llama.cpp](docs/benchmarks.md#results-llamacpp) |"]


def graphs(results: Path) -> list[str]:
    """CUDA graphs against eager forwards on the GPU (``python -m speculant.bench.graph_check``)."""
    data = _load(results, "gpu_graph_check.json")
    if data is None:
        return []
    return markdown_table(
        f"A {data['size']}-parameter-shaped llama with dummy weights, batch 1, greedy; measured on "
        f"{measured_on(data)}.",
        ["dtype", "speculation", "eager ms / step", "graphed ms / step", "speedup", "graphs", "output"],
        (_graph_cells(r) for r in data["rows"]))


def _graph_cells(r: dict[str, Any]) -> list[object]:
    if "graphed_ms_per_decode_step" not in r:
        return [r["dtype"], r["speculation"], "–", "–", "–", "–", r.get("error", "failed")]
    eager, graphed = r["eager_ms_per_decode_step"], r["graphed_ms_per_decode_step"]
    same = "identical" if r["identical"] else ("near tie only" if r["ok"] else "**differs**")
    return [r["dtype"], r["speculation"], f"{eager:.2f}", f"{graphed:.2f}", f"{eager / graphed:.1f}×",
            len(r["graph_keys"]), same]


def graphs_headline(results: Path) -> list[str]:
    """CUDA graphs against eager forwards, every dtype in one line."""
    data = _load(results, "gpu_graph_check.json")
    rows = [r for r in (data or {}).get("rows", []) if r.get("speculation") == "none" and "graph_keys" in r]
    if not rows:
        return []
    parts = [f"{r['dtype']} {r['eager_ms_per_decode_step']:.1f} → {r['graphed_ms_per_decode_step']:.1f} ms "
             f"({r['eager_ms_per_decode_step'] / r['graphed_ms_per_decode_step']:.1f}×)" for r in rows]
    same = "output identical" if all(r["identical"] for r in rows) else "near ties only"
    return [f"| CUDA graphs, batch-1 decode step (135M-shaped llama) | {'; '.join(parts)}, {same} | "
            f"{measured_on(data or {})} | [graphs](docs/benchmarks.md#results-graphs) |"]


def prefix_cache(results: Path) -> list[str]:
    """Prefix caching on SmolLM2-135M-Instruct (``benchmarks/prefix_cache_bench.py``)."""
    data = _load(results, "prefix_cache_smollm2.json")
    if data is None:
        return []
    o = data["options"]
    return markdown_table(
        f"{o['turns']}-turn chat (each turn resends the history) and {o['agents']} agent requests sharing a "
        f"~{o['system_tokens']}-token system prompt, {o['dtype']}, greedy, k = {o['k']}; caching off vs on in "
        f"one run; measured on {measured_on(data)}.",
        ["workload", "speculation", "without caching", "with caching", "gain", "cache hit rate", "output identical"],
        (_prefix_cells(r) for r in data["rows"]))


def _prefix_cells(r: dict[str, Any]) -> list[object]:
    off, on = r["uncached"], r["cached"]
    if r["workload"] == "chat":
        cells = [f"TTFT turns 2+ {off['ttft_turns_2_on_median_s']:.2f} s", f"{on['ttft_turns_2_on_median_s']:.2f} s",
                 f"{r['ttft_speedup_turns_2_on']:.1f}× lower"]
    else:
        cells = [f"{off['output_tokens_per_s']:.1f} tok/s", f"{on['output_tokens_per_s']:.1f} tok/s",
                 f"{r['throughput_speedup']:.1f}× throughput"]
    return [r["workload"], r["method"], *cells, _num(on.get("prefix_cache_hit_rate"), 2),
            "yes" if r["outputs_identical"] else "**no**"]


def prefix_headline(results: Path) -> list[str]:
    """Per workload, every method's gain (the smallest first: the figure to quote)."""
    data = _load(results, "prefix_cache_smollm2.json")
    out = []
    for workload in ("chat", "agents"):
        rows = [r for r in (data or {}).get("rows", []) if r["workload"] == workload]
        if not rows:
            continue
        key = "ttft_speedup_turns_2_on" if workload == "chat" else "throughput_speedup"
        what = "time to first token of turns 2-10" if workload == "chat" else "throughput"
        gains = ", ".join(f"{r['method']} {r[key]:.1f}×" for r in rows)
        same = all(r["outputs_identical"] for r in rows)
        out.append(f"| prefix caching, SmolLM2 {workload} workload: {what} | at least "
                   f"{min(r[key] for r in rows):.1f}× ({gains}), output {'identical' if same else 'differs'} | "
                   f"{measured_on(data or {})} | [prefix](docs/benchmarks.md#results-prefix) |")
    return out
