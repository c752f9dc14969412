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


def timing_fields(decode_rates: list[float], ttfts: list[float]) -> dict[str, Any]:
    """Batch-1 row fields: median decode-only tokens/s over repeats (first token
    excluded) and median time to first token; null where not measured."""
    return {"decode_tokens_per_s": median(decode_rates),
            "decode_tokens_per_s_samples": [round(r, 2) for r in decode_rates],
            "ttft_ms": 1e3 * statistics.median(ttfts) if ttfts else None}


def environment() -> dict[str, Any]:
    import torch
    import transformers

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        load = None
    return {
        "cpu": cpu_name(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "os_cpu_count": os.cpu_count(),
        "load_avg": load,
    }


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


def write_json(path: Path, data: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
