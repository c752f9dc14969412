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

import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import torch

from speculant.interfaces import QuerySpan
from speculant.interfaces.views import RunnerView

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


def measure_curve(runner: RunnerView, max_rows: int, *, ctx: int = 64, rounds: int = 7,
                  clock: Callable[[], float] = time.perf_counter) -> CostCurve:
    """Time forwards of n query rows (logits at every row, as a verify) over a
    cached prefix of ``ctx`` random tokens, sizes interleaved round by round so
    that load drift hits them alike. t(n)/t(1) is the ratio of the fastest
    times: other processes only ever add time, so on a busy machine the
    minimum is the closest to the forward's own cost (a median taken under a
    load of 6 per core measured t(2)/t(1) = 2.9 where a quiet run gives 1.02)."""
    sizes = [n for n in MEASURE_SIZES if n <= max_rows] or [1]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.vocab_size, (ctx + sizes[-1],), generator=g).tolist()
    seq, _ = runner.open_sequence("cost model")
    try:
        runner.grow(seq, ctx + sizes[-1])
        runner.forward([QuerySpan(seq, 0, ids[:ctx], [])])
        spans = {n: QuerySpan(seq, ctx, ids[ctx:ctx + n], list(range(n))) for n in sizes}
        for n in sizes:  # warm-up: a shape's first call primes the linear backend
            runner.forward([spans[n]])
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(rounds):
            for n in sizes:
                t0 = clock()
                runner.forward([spans[n]])
                _sync(runner)
                times[n].append(clock() - t0)
    finally:
        runner.free(seq)
    t1 = min(times[1])
    ratios = [min(times[n]) / t1 if t1 > 0 else 1.0 for n in sizes]
    return CostCurve(tuple(sizes), (1.0, *ratios[1:]), t1)


def _sync(runner: RunnerView) -> None:
    device = getattr(runner, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)


class CostModel:
    """The figures the adaptive policy prices a step with: ``curve`` and the cost
    per drafted token outside the target's forward (``draft_token_cost``, in
    one-row forwards): the proposer's time plus what verifying the extra rows
    adds to acceptance (filtering and sampling their distributions)."""

    def __init__(self, curve: CostCurve, draft_token_cost: float | None = None, *, learn_rate: float = 0.1) -> None:
        self.curve = curve
        self.fixed_draft_cost = draft_token_cost  # None: learnt from step timings
        self._learnt = 0.0
        self._samples = 0
        self._accept_per_row: float | None = None  # acceptance seconds per decode in steps without proposals
        self.learn_rate = learn_rate

    @property
    def draft_token_cost(self) -> float:
        return self.fixed_draft_cost if self.fixed_draft_cost is not None else self._learnt

    def observe_step(self, propose_s: float, accept_s: float, num_decodes: int, num_drafted: int) -> None:
        """A step's proposer and acceptance seconds, with ``num_decodes`` decodes
        verifying ``num_drafted`` proposals. Steps without proposals price a
        decode's own acceptance; steps with them, the rest per drafted token
        (nothing is learnt without a measured one-row time, or with a configured figure)."""
        t1 = self.curve.t1_s
        if self.fixed_draft_cost is not None or not t1 or num_decodes <= 0:
            return
        if num_drafted <= 0:
            row = accept_s / num_decodes
            self._accept_per_row = row if self._accept_per_row is None else \
                self._accept_per_row + self.learn_rate * (row - self._accept_per_row)
            return
        extra = max(0.0, accept_s - (self._accept_per_row or 0.0) * num_decodes)
        sample = min(10.0, (propose_s + extra) / num_drafted / t1)
        self._samples += 1
        w = max(self.learn_rate, 1.0 / self._samples)  # a plain mean at first, then a running one
        self._learnt += w * (sample - self._learnt)

    def describe(self) -> dict:
        return {"cost_curve": self.curve.as_dict(), "draft_token_cost": self.draft_token_cost,
                "draft_token_cost_source": "config" if self.fixed_draft_cost is not None else "measured"}
