"""One request's acceptance, position by position, for the adaptive draft-length policy.

A verify step that drafted d proposals and accepted a of them *reached*
positions 1 .. min(a + 1, d): the first a were accepted, position a + 1 (if
drafted) was rejected, and nothing after it was looked at. For each position
j the estimate keeps decayed counts of the steps that reached it and of those
that accepted it, so ``rate(j)`` estimates P(accept j | reached j), and the
j-th proposal's expected gain in tokens is the product of the rates up to j.

A geometric model (one rate for every position, gain ``a ** j``) prices a run
that is accepted all or nothing, such as a copied span of a code edit, as if
each further token were as doubtful as the first: it plans drafts shorter than
what they would return. Here the first position carries the doubt and the
following ones, once reached, are nearly sure, so long drafts keep their value.

Each position's counts are shrunk toward the rate of the position before it
(the first one's toward ``prior``) with a prior weight that starts at
``PRIOR_WEIGHT`` observations and decays like the counts, so enough evidence
outweighs it entirely (a request whose drafts are always rejected gets an
estimate near 0, not a floor). A position never reached inherits its
predecessor's rate: a request whose drafts are kept whole extends them, one
with a geometric record gets the geometric gains. Counts decay by ``decay``
each time a step reaches the position. A step that verified nothing (k = 0,
or the proposer had nothing to offer) decays every count and restores the
prior weight by the same factor, moving the estimate back toward the prior, so
a request held off is tried again once the prior would pay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_WEIGHT = 2.0
"""Observations a position's prior (its predecessor's rate) is worth before any."""


@dataclass
class PositionAcceptance:
    prior: float  # P(accept) of the first position before any observation
    decay: float  # weight of the past per observation (and per step without one)
    reached: list[float] = field(default_factory=list)  # [j - 1]: decayed steps that reached position j
    accepted: list[float] = field(default_factory=list)  # [j - 1]: of those, decayed steps that accepted it
    weight: list[float] = field(default_factory=list)  # [j - 1]: what the prior is still worth there

    def observe(self, drafted: int, accepted: int) -> None:
        """One verify step: ``drafted`` proposals, the first ``accepted`` of them kept."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"a verify step accepts between 0 and the {drafted} drafted proposals, got {accepted}")
        reached = min(accepted + 1, drafted)
        while len(self.reached) < reached:
            self.reached.append(0.0)
            self.accepted.append(0.0)
            self.weight.append(PRIOR_WEIGHT)
        for j in range(reached):
            self.reached[j] = self.decay * self.reached[j] + 1.0
            self.accepted[j] = self.decay * self.accepted[j] + (j < accepted)
            self.weight[j] *= self.decay

    def drift(self) -> None:
        """A step without verification: every count decays and the prior regains weight."""
        self.reached = [self.decay * x for x in self.reached]
        self.accepted = [self.decay * x for x in self.accepted]
        self.weight = [self.decay * w + (1.0 - self.decay) * PRIOR_WEIGHT for w in self.weight]

    def rates(self, k: int) -> list[float]:
        """P(accept position j | reached it) for j = 1 .. ``k``."""
        out, prev = [], self.prior
        for j in range(k):
            if j < len(self.reached):
                prev = (self.accepted[j] + self.weight[j] * prev) / (self.reached[j] + self.weight[j])
            out.append(prev)
        return out

    def gains(self, k: int) -> list[float]:
        """The expected tokens each of the first ``k`` proposals adds (non-increasing)."""
        out, run = [], 1.0
        for rate in self.rates(k):
            run *= rate
            out.append(run)
        return out
