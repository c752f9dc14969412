"""A cost curve checked against the engine's own step timings.

A curve measured while other processes held the CPU is wrong in a way its
ratios alone do not show: t(1) is inflated, so the larger forwards look
nearly free (a first run under CI load cached t(1) = 32 ms and ratios 1.0,
1.0, 1.0, 1.92 where the quiet machine measures 7.4 ms and 1.10, 1.21, 1.59,
2.18). Every step of decodes alone is a forward of a known number of rows,
so the engine prices it with the curve and compares: ``CurveWatch`` keeps the
live/predicted ratio of the last ``window`` such steps and, once it has them,
gives a verdict on their median.

- ``"fast"``: the live forwards run more than ``factor`` times faster than
  the curve says. The curve was measured under load: it is measured again
  at the engine's next idle point (``CostModel.remeasure_if_due``) and its
  cache file is dropped so that the next load measures afresh.
- ``"slow"``: more than ``slow_factor`` times slower. That is the load now
  (or contexts far longer than the measurement's), not the curve: measuring
  now would record the load, so it is only reported (``cost_curve_live_ratio``).
"""

from __future__ import annotations

from statistics import median
from typing import Literal

Verdict = Literal["fast", "slow"] | None

LIVE_WINDOW = 32
"""Steps of decodes alone whose median decides (a few slow ones do not)."""
FAST_FACTOR = 1.5
SLOW_FACTOR = 3.0


class CurveWatch:
    def __init__(self, window: int = LIVE_WINDOW, factor: float = FAST_FACTOR,
                 slow_factor: float = SLOW_FACTOR) -> None:
        if window < 1 or factor <= 1 or slow_factor <= 1:
            raise ValueError(f"CurveWatch needs window >= 1 and factors > 1; got window={window}, "
                             f"factor={factor}, slow_factor={slow_factor}")
        self.window, self.factor, self.slow_factor = window, factor, slow_factor
        self._ratios: list[float] = []
        self.last_ratio: float | None = None  # the median of the last full window

    def observe(self, predicted_s: float, seconds: float) -> Verdict:
        """A forward the curve prices at ``predicted_s`` took ``seconds``; a verdict once a window is full."""
        if predicted_s <= 0 or seconds <= 0:
            return None
        self._ratios.append(seconds / predicted_s)
        if len(self._ratios) < self.window:
            return None
        self.last_ratio = median(self._ratios)
        self._ratios = []
        if self.last_ratio * self.factor < 1:
            return "fast"
        if self.last_ratio > self.slow_factor:
            return "slow"
        return None

    def reset(self) -> None:
        self._ratios = []
