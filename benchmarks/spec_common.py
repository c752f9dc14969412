"""Helpers for the speculative-decoding benchmark that ``common.py`` lacks.

``common.py`` builds one model per spec, each with its own freshly trained
tokenizer, and its ``bench`` target allows 2,048 positions. The speculative
benchmark needs a target allowing a 2,000-token prompt plus decodes (4,096
positions here), a ~10M draft that shares the target's tokenizer byte for
byte, and a quiet machine. Model building itself is ``common.build_model``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from common import DEFAULT_CACHE_DIR, ModelSpec, build_cached

# ~134M (untied 32000-vocab embeddings and head, like the "134M target")
# and ~9.8M (tied embeddings: the 32000 x 256 table is most of it).
SPEC_MODELS = {
    "target": ModelSpec("spec-target", hidden=768, layers=12, heads=12, kv_heads=12, intermediate=2048,
                        max_positions=4096),
    "draft": ModelSpec("spec-draft", hidden=256, layers=2, heads=4, kv_heads=4, intermediate=688,
                       max_positions=4096, tie_embeddings=True, seed=1),
    "quick-target": ModelSpec("spec-quick-target", hidden=256, layers=4, heads=4, kv_heads=4,
                              intermediate=688, max_positions=4096),
    "quick-draft": ModelSpec("spec-quick-draft", hidden=64, layers=1, heads=2, kv_heads=2,
                             intermediate=172, max_positions=4096, tie_embeddings=True, seed=1),
}


def ensure_target_and_draft(quick: bool, cache_dir: Path = DEFAULT_CACHE_DIR) -> tuple[Path, Path]:
    prefix = "quick-" if quick else ""
    target = build_cached(SPEC_MODELS[prefix + "target"], cache_dir)
    draft = build_cached(SPEC_MODELS[prefix + "draft"], cache_dir, tokenizer_from=target)
    return target, draft


def wait_for_quiet(threshold: float, max_wait_s: float, poll_s: float = 30.0) -> dict:
    """Poll the 1-minute load average until it drops below ``threshold``
    (or ``max_wait_s`` passes); return what was seen."""
    t0 = time.time()
    seen = []
    while True:
        load = os.getloadavg()[0]
        seen.append(round(load, 2))
        if load < threshold:
            return {"quiet": True, "waited_s": round(time.time() - t0, 1), "load_1m": load, "polls": seen}
        if time.time() - t0 >= max_wait_s:
            return {"quiet": False, "waited_s": round(time.time() - t0, 1), "load_1m": load, "polls": seen}
        print(f"load average {load:.2f} >= {threshold}; waiting {poll_s:.0f}s", file=sys.stderr, flush=True)
        time.sleep(poll_s)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
