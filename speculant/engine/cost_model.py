"""What a step costs, for the adaptive draft-length policy: the target's
forward of n query rows against one, t(n)/t(1), and the proposer's cost per
drafted token in the same unit.

``CostCurve`` holds t(n)/t(1) at a few n and interpolates linearly between
them (and past the last one along the last segment): on the CPU a forward's
cost is flat while the weights' memory traffic dominates and then climbs,
which no single slope describes (``benchmarks/results/verify_rows*.json``).

``measure_curve`` times the target at load (``cost_cache.py`` keeps the
result per model, dtype, backend and CPU). ``CostModel`` pairs the curve with
the cost per drafted token outside the forward, either a configured figure or
one learnt from the engine's own step timings (a running mean of the
proposer's seconds plus the acceptance seconds the drafts added, per drafted
token, over the seconds of a one-row forward).
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from speculant.engine.cost_watch import CurveWatch
from speculant.interfaces import QuerySpan
from speculant.interfaces.views import RunnerView

logger = logging.getLogger(__name__)

MEASURE_SIZES = (1, 2, 4, 8, 16, 32)
"""Query rows timed at load (those above the token budget are left out)."""


@dataclass(frozen=True)
class CostCurve:
    """t(n)/t(1) at ``sizes`` (ascending, starting at 1, where the ratio is 1),
    made non-decreasing; ``t1_s`` is the seconds of a one-row forward when measured."""

    sizes: tuple[int, ...]
    ratios: tuple[float, ...]
    t1_s: float | None = None

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.ratios) or not self.sizes or self.sizes[0] != 1 \
                or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError(f"a cost curve needs ascending distinct sizes starting at 1, one ratio each; got "
                             f"sizes {self.sizes} and ratios {self.ratios}")
        mono, top = [], 0.0
        for r in (1.0, *self.ratios[1:]):
            top = max(top, float(r))  # noise must not make more rows look cheaper
            mono.append(top)
        object.__setattr__(self, "ratios", tuple(mono))

    @classmethod
    def linear(cls, token_cost: float) -> CostCurve:
        """The linear model ``(1 - c) + c * n`` (a configured ``token_cost``)."""
        return cls((1, 2), (1.0, 1.0 + token_cost))

    def cost(self, n: float) -> float:
        """t(n)/t(1) for ``n`` >= 1 rows (0 rows cost nothing)."""
        if n <= 0:
            return 0.0
        s, r = self.sizes, self.ratios
        if len(s) == 1:
            return 1.0
        i = min(max(bisect_right(s, n) - 1, 0), len(s) - 2)  # the segment holding n, or the last one
        slope = (r[i + 1] - r[i]) / (s[i + 1] - s[i])
        return r[i] + slope * (n - s[i])

    def as_dict(self) -> dict:
        return {"sizes": list(self.sizes), "ratios": list(self.ratios), "t1_s": self.t1_s}


@dataclass(frozen=True)
class Measurement:
    """A timed curve and whether it can be trusted beyond this process:
    ``agreed`` when two consecutive passes gave the same curve (``curves_agree``)."""

    curve: CostCurve
    agreed: bool
    num_passes: int


def curves_agree(a: CostCurve, b: CostCurve, tolerance: float = 0.15, t1_factor: float = 1.3) -> bool:
    """Two passes measured the same forward: t(1) within ``t1_factor`` of each
    other and every ratio within ``tolerance`` (relative). Load from other
    processes is bursty, so a pass it distorted rarely agrees with the next."""
    if a.sizes != b.sizes or not a.t1_s or not b.t1_s:
        return False
    if max(a.t1_s, b.t1_s) > t1_factor * min(a.t1_s, b.t1_s):
        return False
    return all(abs(x - y) <= tolerance * max(x, y) for x, y in zip(a.ratios, b.ratios))


def measure_curve(runner: RunnerView, max_rows: int, *, ctx: int = 64, rounds: int = 7, max_passes: int = 3,
                  tolerance: float = 0.15, clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Time forwards of n query rows (logits at every row, as a verify) over a
    cached prefix of ``ctx`` random tokens, in passes of ``rounds`` rounds,
    sizes interleaved round by round so that load drift hits them alike.

    A pass's t(n)/t(1) is the ratio of its fastest times: other processes only
    ever add time, so on a busy machine the minimum is the closest to the
    forward's own cost (a median taken under a load of 6 per core measured
    t(2)/t(1) = 2.9 where a quiet run gives 1.02). Passes repeat until two in a
    row agree (``curves_agree``), at most ``max_passes``; the curve is then
    taken from the fastest times of all passes. Without agreement the result
    is ``agreed=False``: usable for this process, not worth caching."""
    sizes = [n for n in MEASURE_SIZES if n <= max_rows] or [1]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.vocab_size, (ctx + sizes[-1],), generator=g).tolist()
    seq, _ = runner.open_sequence("cost model")
    best: dict[int, float] = {}
    passes: list[CostCurve] = []
    try:
        runner.grow(seq, ctx + sizes[-1])
        runner.forward([QuerySpan(seq, 0, ids[:ctx], [])])
        spans = {n: QuerySpan(seq, ctx, ids[ctx:ctx + n], list(range(n))) for n in sizes}
        for n in sizes:  # warm-up: a shape's first call primes the linear backend
            runner.forward([spans[n]])
        while len(passes) < max(1, max_passes):
            times = _one_pass(runner, spans, rounds, clock)
            passes.append(_curve(sizes, times))
            best = {n: min(t, best.get(n, t)) for n, t in times.items()}
            if len(passes) >= 2 and curves_agree(passes[-2], passes[-1], tolerance):
                break
    finally:
        runner.free(seq)
    agreed = len(passes) >= 2 and curves_agree(passes[-2], passes[-1], tolerance)
    return Measurement(_curve(sizes, best), agreed, len(passes))


def _one_pass(runner: RunnerView, spans: dict[int, QuerySpan], rounds: int,
              clock: Callable[[], float]) -> dict[int, float]:
    """The fastest of ``rounds`` timed forwards of each size."""
    times: dict[int, float] = {}
    for _ in range(rounds):
        for n, span in spans.items():
            t0 = clock()
            runner.forward([span])
            _sync(runner)
            dt = clock() - t0
            times[n] = min(dt, times.get(n, dt))
    return times


def _curve(sizes: list[int], times: dict[int, float]) -> CostCurve:
    t1 = times[1]
    ratios = [times[n] / t1 if t1 > 0 else 1.0 for n in sizes]
    return CostCurve(tuple(sizes), (1.0, *ratios[1:]), t1)


def _sync(runner: RunnerView) -> None:
    device = getattr(runner, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)


class CurveSource(Protocol):
    """Where a measured curve comes from (``cost_cache.CachedCurve``): measure it
    again (caching the result when its passes agree), or drop the cached copy."""

    def measure(self) -> Measurement: ...

    def invalidate(self) -> None: ...


MAX_REMEASUREMENTS = 3
"""Per process: on a machine that stays loaded, measuring again cannot help."""


class CostModel:
    """The figures the adaptive policy prices a step with: ``curve`` and the cost
    per drafted token outside the target's forward (``draft_token_cost``, in
    one-row forwards): the proposer's time plus what verifying the extra rows
    adds to acceptance (filtering and sampling their distributions); and the
    cost of asking a decode for proposals that it did not get (``ask_cost``:
    the proposer's time in steps of decodes alone that drafted nothing, per
    decode asked; an n-gram search that found no match).

    A measured curve (``source`` set) is checked against live step timings
    (``cost_watch``) and measured again at an idle point when they show it was
    taken under load; ``origin`` says where the current curve came from."""

    def __init__(self, curve: CostCurve, draft_token_cost: float | None = None, *, learn_rate: float = 0.1,
                 source: CurveSource | None = None, origin: str = "config") -> None:
        self.curve = curve
        self.fixed_draft_cost = draft_token_cost  # None: learnt from step timings
        self._learnt = 0.0
        self._samples = 0
        self._accept_per_row: float | None = None  # acceptance seconds per decode in steps without proposals
        self._ask_cost = 0.0  # learnt ask_cost
        self._ask_samples = 0
        self.learn_rate = learn_rate
        self.source = source
        self.origin = origin
        self.watch = CurveWatch()
        self.remeasure_due = False
        self.num_remeasurements = 0
    @property
    def draft_token_cost(self) -> float:
        return self.fixed_draft_cost if self.fixed_draft_cost is not None else self._learnt

    @property
    def ask_cost(self) -> float:
        """One-row forwards an ask for proposals costs when it gets none (0 with a configured draft cost)."""
        return self._ask_cost if self.fixed_draft_cost is None else 0.0

    def observe_step(self, propose_s: float, accept_s: float, num_decodes: int, num_drafted: int,
                     num_asked: int = 0) -> None:
        """A step's proposer and acceptance seconds, with ``num_decodes`` decodes
        verifying ``num_drafted`` proposals. Steps without proposals price a
        decode's own acceptance, and, when ``num_asked`` decodes were asked (pass 0
        for a step with prefill chunks, which a proposer may follow), an empty ask;
        steps with them, the rest per drafted token (nothing is learnt without a
        measured one-row time, or with a configured figure)."""
        t1 = self.curve.t1_s
        if self.fixed_draft_cost is not None or not t1 or num_decodes <= 0:
            return
        if num_drafted <= 0:
            row = accept_s / num_decodes
            self._accept_per_row = row if self._accept_per_row is None else \
                self._accept_per_row + self.learn_rate * (row - self._accept_per_row)
            if num_asked > 0:
                self._ask_samples += 1
                w = max(self.learn_rate, 1.0 / self._ask_samples)
                self._ask_cost += w * (min(10.0, propose_s / num_asked / t1) - self._ask_cost)
            return
        extra = max(0.0, accept_s - (self._accept_per_row or 0.0) * num_decodes)
        sample = min(10.0, (propose_s + extra) / num_drafted / t1)
        self._samples += 1
        w = max(self.learn_rate, 1.0 / self._samples)  # a plain mean at first, then a running one
        self._learnt += w * (sample - self._learnt)

    def observe_forward(self, num_rows: int, seconds: float) -> None:
        """A step of decodes alone: one target forward of ``num_rows`` rows took ``seconds``."""
        if self.source is None or self.remeasure_due or not self.curve.t1_s or num_rows <= 0:
            return
        verdict = self.watch.observe(self.curve.t1_s * self.curve.cost(num_rows), seconds)
        if verdict == "fast" and self.num_remeasurements < MAX_REMEASUREMENTS:
            logger.warning("the target's forwards run %.1fx faster than its cost curve says (t(1) %.2f ms, %s): "
                           "it was measured under load; measuring it again when the engine is idle",
                           1 / (self.watch.last_ratio or 1), 1e3 * (self.curve.t1_s or 0), self.origin)
            self.remeasure_due = True
            self.source.invalidate()  # the next load measures afresh even if this process never idles
        elif verdict == "slow":
            logger.info("the target's forwards run %.1fx slower than its cost curve says: load on the machine "
                        "now, or contexts longer than the measurement's; the curve is kept",
                        self.watch.last_ratio or 0)

    def remeasure_if_due(self) -> bool:
        """Measure the curve again if live timings showed it wrong (call when the
        engine is idle: it borrows the target's free blocks for about a second).
        The new curve replaces the old when its passes agree; True if it did."""
        if not self.remeasure_due or self.source is None:
            return False
        self.remeasure_due = False
        self.num_remeasurements += 1
        m = self.source.measure()
        self.watch.reset()
        if not m.agreed:
            logger.warning("measuring the cost curve again gave passes that disagree (the machine is still "
                           "busy); keeping the current one")
            return False
        self.curve, self.origin = m.curve, "measured again at an idle point"
        return True

    def describe(self) -> dict:
        return {"cost_curve": self.curve.as_dict(), "cost_curve_origin": self.origin,
                "cost_curve_live_ratio": self.watch.last_ratio, "cost_remeasurements": self.num_remeasurements,
                "draft_token_cost": self.draft_token_cost,
                "ask_cost": self.ask_cost,
                "draft_token_cost_source": "config" if self.fixed_draft_cost is not None else "measured"}
