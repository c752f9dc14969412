"""Choosing the fast decoder at load: ``model.fast_forward`` = auto | on | off.

``select_fast_forward`` plans the model (``plan.py``), builds the decoder
(``decoder.py``, ``weights.py``) and runs the exactness probe: a small mixed
batch (two prompts' prefill chunks, then a multi-token continuation and a
one-token decode over their cached prefixes) through transformers' modules and
through the fast decoder, on the runner's own paged cache; the logits must
agree within ``PROBE_TOLERANCE`` of their scale. ``auto`` takes the fast path
when all of that holds and otherwise keeps transformers' modules, logging why;
``on`` turns the reason into a ``FastForwardError``. The outcome, with the
build and probe times, is a ``FastForwardStatus``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from speculant.interfaces.span_tensors import PagedSpan
from speculant.model.fast_forward.decoder import FastDecoder
from speculant.model.fast_forward.plan import plan_model
from speculant.model.fast_forward.weights import WeightsError
from speculant.model.linear.quantized import activation_rounding

logger = logging.getLogger(__name__)

PROBE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 0.02, torch.float16: 0.01}
"""Largest max|fast - reference| / max(1, max|reference|) over the probe's logits. Both
paths run the same GEMMs and norms, so on the CPU they agree bit for bit (deviation 0);
the tolerance covers a backend whose concatenated GEMM rounds differently in the last
bit, while a wrong position, head layout or residual moves logits by O(1)."""
_PROBE_LENGTHS = ((5, 3), (4, 1))  # per sequence: (prefill chunk, continuation) tokens


class FastForwardError(ValueError):
    """``model.fast_forward = "on"`` but the fast decoder cannot run this model exactly."""


@dataclass(frozen=True)
class FastForwardStatus:
    """What ``model.fast_forward`` resolved to for one runner."""

    setting: str
    decoder: FastDecoder | None
    reason: str | None  # why the reference path runs (None when the fast path does)
    build_s: float = 0.0
    probe_s: float = 0.0
    deviation: float | None = None  # the probe's relative logit deviation

    @property
    def active(self) -> bool:
        return self.decoder is not None

    def describe(self) -> str:
        if self.decoder is not None:
            fused = self.decoder.fused_reason
            layers = "all layers in one C call" if fused is None else f"layer by layer: not fused, {fused}"
            return (f"fast decoder ({self.decoder.plan.spec.model_type}; built in {self.build_s:.3f} s, "
                    f"probe {self.probe_s:.3f} s, deviation {self.deviation:.2g}; {layers})")
        return f"transformers' modules ({self.reason})"


ForwardFn = Callable[[list[PagedSpan], FastDecoder | None], torch.Tensor]
"""The runner's forward over spans with a given decoder (None: the reference path) -> logits [R, V]."""


def select_fast_forward(setting: str, model: Any, max_model_len: int, runner,
                        forward: ForwardFn, option: str) -> FastForwardStatus:
    """Resolve ``model.fast_forward`` for ``runner`` (a ModelRunner with its caches allocated)."""
    if setting == "off":
        return FastForwardStatus(setting, None, "model.fast_forward = 'off'")
    start = time.perf_counter()
    decoder, reason = build_decoder(model, max_model_len)
    build_s = time.perf_counter() - start
    deviation = None
    probe_s = 0.0
    if decoder is not None:
        start = time.perf_counter()
        deviation = probe_deviation(runner, decoder, forward)
        probe_s = time.perf_counter() - start
        limit = max(PROBE_TOLERANCE.get(model.dtype, 1e-4), activation_rounding(model))
        if not deviation <= limit:  # also catches NaN
            reason = (f"its logits differ from transformers' modules by {deviation:.3g} of their scale in the "
                      f"load-time probe (allowed {limit:g} in {str(model.dtype).removeprefix('torch.')})")
            decoder = None
    if decoder is None:
        assert reason is not None
        path = getattr(model.config, "_name_or_path", "") or "?"
        if setting == "on":
            raise FastForwardError(
                f"model.fast_forward = 'on' cannot run {option} = {path!r} ({model.config.model_type}): {reason}. "
                "Set model.fast_forward = 'auto' to run such a model on transformers' modules, or 'off'.")
        logger.info("%s: model.fast_forward = 'auto' runs transformers' modules: %s", option, reason)
        return FastForwardStatus(setting, None, reason, build_s, probe_s, deviation)
    logger.info("%s: fast decoder on (%s; build %.3f s, probe %.3f s, deviation %.2g)", option,
                decoder.plan.spec.model_type, build_s, probe_s, deviation)
    return FastForwardStatus(setting, decoder, None, build_s, probe_s, deviation)


def build_decoder(model: Any, max_model_len: int) -> tuple[FastDecoder | None, str | None]:
    plan = plan_model(model, max_model_len)
    if isinstance(plan, list):
        return None, "; ".join(plan)
    try:
        return FastDecoder(model, plan, max_model_len), None
    except WeightsError as exc:
        return None, str(exc)


@torch.inference_mode()
def probe_deviation(runner, decoder: FastDecoder, forward: ForwardFn) -> float:
    """Relative logit deviation of ``decoder`` from the reference path on a mixed paged batch."""
    gen = torch.Generator().manual_seed(0)
    room = min(runner.max_model_len, runner.num_blocks * runner.block_size)
    lengths = [(min(a, room - 1), min(b, room - min(a, room - 1))) for a, b in _PROBE_LENGTHS]
    tables = runner.scratch_tables([a + b for a, b in lengths])
    if len(tables) < len(lengths):  # a pool this small holds one probe sequence
        lengths, tables = lengths[:1], runner.scratch_tables([sum(lengths[0])])
    deviation = 0.0
    seqs = [torch.randint(0, runner.vocab_size, (a + b,), generator=gen).tolist() for a, b in lengths]
    stages = [[PagedSpan(t, 0, s[:a], list(range(a))) for t, s, (a, _) in zip(tables, seqs, lengths)],
              [PagedSpan(t, a, s[a:], list(range(b))) for t, s, (a, b) in zip(tables, seqs, lengths) if b]]
    stages = [spans for spans in stages if spans]
    # each path runs every stage in order on the same slots: its later stages read its own K/V
    refs = [forward(spans, None) for spans in stages]
    for spans, ref in zip(stages, refs):
        got = forward(spans, decoder)
        scale = max(1.0, float(ref.abs().max()))
        deviation = max(deviation, float((got - ref).abs().max()) / scale)
    return deviation
