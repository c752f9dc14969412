"""The measured cost curve, kept on disk per model, dtype, backend and CPU.

``load_cost_model`` resolves the adaptive policy's figures at engine load:

1. a figure in the config (``draft_length.token_cost``) or in the environment
   (``SPECULANT_TOKEN_COST``; ``SPECULANT_DRAFT_TOKEN_COST`` for the proposer's)
   is used as it is: nothing is timed (tests, reproducible runs);
2. otherwise the curve cached under ``<cache root>/cost/<key>.json`` is read, the
   key hashing what decides a forward's cost: the model's config.json and
   weight files (names and sizes), the GGUF file, the dtype, the attention
   backend, the linear and fast-forward paths, the C kernels in use, the CPU's
   model name and flags, the torch threads and version;
3. otherwise, or when that file cannot be read or holds no valid curve, the
   target is timed (``cost_model.measure_curve``, one to two seconds) and the
   file (re)written if two passes of the measurement agreed; a curve whose
   passes disagree (other processes held the CPU) serves this process only; a
   cache directory that cannot be written only costs the measurement next time.

A measured curve stays checked against the live step timings
(``cost_watch``): when they show it was taken under load, its file is
removed and it is measured again at the engine's next idle point.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speculant.config.models import AdaptiveDraftLengthConfig, EngineConfig
from speculant.engine.cost_model import CostCurve, CostModel, Measurement, measure_curve
from speculant.engine.runner_view import SequenceRunner
from speculant.model.kernels.build import cache_root
from speculant.model.runner import ModelRunner

logger = logging.getLogger(__name__)

TOKEN_COST_ENV = "SPECULANT_TOKEN_COST"
DRAFT_TOKEN_COST_ENV = "SPECULANT_DRAFT_TOKEN_COST"
CACHE_VERSION = 1


def _env_figure(name: str, upper: float) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= upper:
        raise ValueError(f"environment variable {name}={raw!r} must be a number in [0, {upper}]: it replaces the "
                         "measured cost figure; unset it to measure, or give e.g. 0.05")
    return value


def cost_key(config: EngineConfig, runner: ModelRunner) -> dict[str, Any]:
    """What decides the cost of a forward here (hashed into the cache file's name)."""
    source = Path(config.model.path)
    files: dict[str, int | str | None] = {}
    if source.is_dir():
        for f in sorted(source.iterdir()):
            if f.suffix in (".safetensors", ".bin", ".gguf") and f.is_file():
                files[f.name] = f.stat().st_size
        cfg = source / "config.json"
        files["config.json"] = hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg.is_file() else None
    elif source.is_file():
        files[source.name] = source.stat().st_size
    try:
        cpu = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
               if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        cpu = [platform.processor()]
    return {
        "version": CACHE_VERSION, "model": str(source.resolve()), "files": files,
        "gguf_file": config.model.gguf_file, "dtype": config.model.dtype, "device": str(runner.device),
        "attention_backend": getattr(runner.backend, "name", type(runner.backend).__name__),
        "linear": runner.linear_report.describe(), "fast_forward": _forward_path(runner),
        "kernels": runner.kernel_report, "cpu": cpu, "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def _forward_path(runner: ModelRunner) -> str:
    """The decoder path, without the load-time timings its description carries."""
    ff = runner.fast_forward
    if ff.decoder is None:
        return f"transformers' modules ({ff.reason})"
    return f"fast decoder ({ff.decoder.plan.spec.model_type}; fused: {ff.decoder.fused_reason or 'yes'})"


def cache_file(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return cache_root() / "cost" / f"{digest}.json"


def read_curve(path: Path, key: dict[str, Any]) -> CostCurve | None:
    """The curve stored at ``path`` for ``key``; None when missing, unreadable or not valid."""
    try:
        data = json.loads(path.read_text())
        if data.get("key") != json.loads(json.dumps(key, default=str)):
            return None
        c = data["curve"]
        return CostCurve(tuple(int(n) for n in c["sizes"]), tuple(float(r) for r in c["ratios"]),
                         float(c["t1_s"]) if c.get("t1_s") is not None else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if path.exists():
            logger.warning("cost model cache %s is unreadable (%s: %s); measuring again", path,
                           type(exc).__name__, exc)
        return None


def write_curve(path: Path, key: dict[str, Any], curve: CostCurve) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "curve": curve.as_dict()}, default=str, indent=1))
        tmp.replace(path)  # atomic: a reader never sees half a file
    except OSError as exc:
        logger.warning("could not cache the cost model in %s (%s); it is measured again at the next load", path, exc)


class CachedCurve:
    """The target's curve as measured here and kept under ``path`` (``CurveSource``)."""

    def __init__(self, view: SequenceRunner, path: Path, key: dict[str, Any], max_rows: int, ctx: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.view, self.path, self.key, self.max_rows, self.ctx, self.clock = view, path, key, max_rows, ctx, clock
        self.rounds = 7  # timed rounds per pass

    def measure(self) -> Measurement:
        """Time the target; cache the curve only when its passes agreed (a curve
        measured under load serves this process alone, with a warning)."""
        m = measure_curve(self.view, self.max_rows, ctx=self.ctx, rounds=self.rounds, clock=self.clock)
        shown = dict(zip(m.curve.sizes, (round(r, 3) for r in m.curve.ratios)))
        if m.agreed:
            write_curve(self.path, self.key, m.curve)
            logger.info("measured the target's cost curve t(n)/t(1): %s (t(1) %.2f ms, %d passes); cached in %s",
                        shown, 1e3 * (m.curve.t1_s or 0), m.num_passes, self.path)
        else:
            logger.warning("the target's cost curve t(n)/t(1) = %s (t(1) %.2f ms) changed from pass to pass over "
                           "%d passes (other processes were using the CPU): it is used by this process only and "
                           "not cached; the next load measures again (set %s to skip measuring)",
                           shown, 1e3 * (m.curve.t1_s or 0), m.num_passes, TOKEN_COST_ENV)
        return m

    def invalidate(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("could not remove the stale cost model cache %s (%s)", self.path, exc)


def load_cost_model(config: EngineConfig, runner: ModelRunner, view: SequenceRunner) -> CostModel:
    """The adaptive policy's figures for ``config`` on the target ``view`` (module
    docstring); a measurement borrows blocks of its idle pool and gives them back."""
    dl = config.speculative.draft_length
    assert isinstance(dl, AdaptiveDraftLengthConfig)
    draft_cost = dl.draft_token_cost if dl.draft_token_cost is not None else _env_figure(DRAFT_TOKEN_COST_ENV, 10)
    token_cost = dl.token_cost if dl.token_cost is not None else _env_figure(TOKEN_COST_ENV, 1)
    if token_cost is not None:
        return CostModel(CostCurve.linear(token_cost), draft_cost)
    key = cost_key(config, runner)
    path = cache_file(key)
    source = CachedCurve(view, path, key, max(1, min(config.scheduler.max_num_batched_tokens, 32)),
                         min(64, max(1, runner.max_model_len - 33)))
    curve = read_curve(path, key)
    if curve is not None:
        return CostModel(curve, draft_cost, source=source, origin=f"cache {path}")
    m = source.measure()
    return CostModel(m.curve, draft_cost, source=source,
                     origin="measured at load" if m.agreed else "measured at load, passes disagreed: not cached")
