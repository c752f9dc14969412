"""Statistics, environment facts and output (JSON, Markdown table) for
``speculant bench``; the PNG chart is ``speculant.bench.chart``."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0-100) of ``values``."""
    data = sorted(values)
    if not data:
        return math.nan
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def timing_fields(decode_rates: list[float], ttfts: list[float], gaps: list[float]) -> dict[str, Any]:
    """Batch-1 row fields from raw samples: median decode-only tokens/s over
    repeats (first token excluded), median time to first token, p50/p99
    inter-token latency; null where not measured. The raw TTFTs and gaps (in
    seconds) ride along as ``_ttfts`` / ``_gaps`` so repeats measured apart can
    be merged (``merge_repeats``); ``drop_raw`` removes them before output."""
    return {"decode_tokens_per_s": median(decode_rates),
            "decode_tokens_per_s_samples": [round(r, 2) for r in decode_rates],
            "ttft_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
            "itl_p50_ms": 1e3 * percentile(gaps, 50) if gaps else None,
            "itl_p99_ms": 1e3 * percentile(gaps, 99) if gaps else None,
            "_ttfts": list(ttfts), "_gaps": list(gaps)}


def merge_repeats(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (engine, method, concurrency) from runs of one repeat each
    (interleaved so that load from other jobs hits every row alike): samples
    concatenated, medians and percentiles recomputed, acceptance averaged. A
    repeat that failed fails the row; tokens that differ between repeats too."""
    merged: dict[tuple, dict[str, Any]] = {}
    for rows in runs:
        for r in rows:
            key = (r["engine"], r["method"], r["concurrency"])
            accept = {"_accept": [r["acceptance_rate"]] if r.get("acceptance_rate") is not None else [],
                      "_accepted_len": ([r["mean_accepted_length"]]
                                        if r.get("mean_accepted_length") is not None else [])}
            if key not in merged:
                merged[key] = {**r, **accept}
                continue
            m = merged[key]
            if m.get("status") != "ok":
                continue
            if r.get("status") != "ok":
                m["status"] = r["status"]
                continue
            if r.get("token_ids") != m.get("token_ids"):
                m["status"] = "error: greedy tokens differ between repeats"
                continue
            for field in ("_accept", "_accepted_len"):
                m[field] = m[field] + accept[field]
            for field in ("tokens_per_s_samples", "decode_tokens_per_s_samples", "_ttfts", "_gaps"):
                m[field] = list(m.get(field) or []) + list(r.get(field) or [])
    out = []
    for m in merged.values():
        accept, accepted_len = m.pop("_accept"), m.pop("_accepted_len")
        if m.get("status") == "ok":
            m["tokens_per_s"] = median(m.get("tokens_per_s_samples") or [])
            if "_ttfts" in m:
                decode = m.get("decode_tokens_per_s_samples") or []
                m.update(timing_fields(decode, m["_ttfts"], m["_gaps"]))
            m["acceptance_rate"] = statistics.fmean(accept) if accept else m.get("acceptance_rate")
            m["mean_accepted_length"] = statistics.fmean(accepted_len) if accepted_len else m.get(
                "mean_accepted_length")
        out.append(m)
    return out


def drop_raw(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        for field in ("_ttfts", "_gaps", "token_ids"):
            r.pop(field, None)


def environment() -> dict[str, Any]:
    """The facts every result file records (``speculant bench`` and every script in
    benchmarks/): machine, CPU (and GPU under CUDA), date, commit, versions, threads
    and the load average when it was taken."""
    import torch
    import transformers

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        load = None
    return {
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "os_cpu_count": os.cpu_count(),
        "load_avg": load,
        "git_commit": git_commit(),
        **({"gpu": torch.cuda.get_device_name(0)} if torch.cuda.is_available() else {}),
    }


def gpu_peak_reset(device: str) -> None:
    """Start a row's peak-memory window on a CUDA ``device`` (nothing on the CPU)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def gpu_peak_gb(device: str) -> float | None:
    """Peak GPU memory allocated since ``gpu_peak_reset``, in GB; None on the CPU."""
    import torch

    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    return round(torch.cuda.max_memory_allocated() / 1e9, 3)


def git_commit() -> str | None:
    """The checkout's commit (``-dirty`` with uncommitted changes), or None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (what every figure is labelled with)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return " ".join(str(value).split()).replace("|", "\\|")  # one line, no stray cell breaks


COLUMNS = (("engine", "engine"), ("method", "method"), ("concurrency", "bs"), ("tokens_per_s", "tok/s"),
           ("decode_tokens_per_s", "decode tok/s"), ("bound_fraction", "of bound"), ("ttft_ms", "TTFT ms"),
           ("acceptance_rate", "accept"), ("mean_accepted_length", "mean acc. len"),
           ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms"), ("matches_no_spec", "same tokens"),
           ("status", "status"), ("note", "note"))


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(key)) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


COMPACT_ABOVE = 20_000  # characters of indented JSON


def write_json(path: Path, data: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, default=str)
    if len(text) > COMPACT_ABOVE:  # the tracked tree travels to GPU runs: big results stay compact
        text = json.dumps(data, separators=(",", ":"), default=str)
    path.write_text(text + "\n")
