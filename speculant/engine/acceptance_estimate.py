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
each time a step reaches the position. A step in which the request was not
asked for proposals (k = 0) decays every count and restores the prior weight
by the same factor, moving the estimate back toward the prior, so a request
held off is tried again once the prior would pay.

"Nothing to offer" is counted apart from rejection. A step that asked for
proposals and got none (n-gram found no match, suffix no confident
continuation) reached no position, so it leaves the positions' counts alone;
it lowers the *offer rate* instead, P(the proposer offers | asked), from
decayed counts of asks (``OFFER_DECAY``, ``OFFER_DRIFT``) with a prior of 1
worth ``PRIOR_WEIGHT`` asks. Every
gain is scaled by the offer rate; the policy scales the drafts' rows by it
too and prices each ask at what an empty one costs (the search, the checks;
``CostModel.ask_cost``), so a proposer that keeps having nothing is asked
less, and steps without an ask restore the offer prior's weight like the
positions', so it is asked again later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_WEIGHT = 2.0
"""Observations a position's prior (its predecessor's rate) is worth before any."""
OFFER_DECAY = 0.9
"""Weight of the past in the offer rate per ask (about ten asks tell a rare offer from none)."""
OFFER_DRIFT = 0.99
"""Weight of the past in the offer rate per step without an ask. Slower than per ask: a
request held off drifts back at a tenth of the rate asks lower it, so a proposer that
offers less often than the policy's bar is asked in about a fifth of the steps, not in
most of them (they would meet halfway), and still soon after its text starts to repeat."""


@dataclass
class PositionAcceptance:
    prior: float  # P(accept) of the first position before any observation
    decay: float  # weight of the past per observation (and per step without one)
    reached: list[float] = field(default_factory=list)  # [j - 1]: decayed steps that reached position j
    accepted: list[float] = field(default_factory=list)  # [j - 1]: of those, decayed steps that accepted it
    weight: list[float] = field(default_factory=list)  # [j - 1]: what the prior is still worth there
    asked: float = 0.0  # decayed steps that asked for proposals
    offered: float = 0.0  # of those, decayed steps in which the proposer offered at least one
    offer_weight: float = PRIOR_WEIGHT  # what the offer prior (it offers) is still worth

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
        self._ask(offered=True)

    def nothing_offered(self) -> None:
        """A step that asked for proposals and got none: no position was reached."""
        self._ask(offered=False)

    def _ask(self, offered: bool) -> None:
        self.asked = OFFER_DECAY * self.asked + 1.0
        self.offered = OFFER_DECAY * self.offered + offered
        self.offer_weight *= OFFER_DECAY

    def offer_rate(self) -> float:
        """P(the proposer offers at least one proposal | asked)."""
        return (self.offered + self.offer_weight) / (self.asked + self.offer_weight)

    def drift(self) -> None:
        """A step without an ask: every count decays and the priors regain weight."""
        self.reached = [self.decay * x for x in self.reached]
        self.accepted = [self.decay * x for x in self.accepted]
        self.weight = [self.decay * w + (1.0 - self.decay) * PRIOR_WEIGHT for w in self.weight]
        self.asked, self.offered = OFFER_DRIFT * self.asked, OFFER_DRIFT * self.offered
        self.offer_weight = OFFER_DRIFT * self.offer_weight + (1.0 - OFFER_DRIFT) * PRIOR_WEIGHT

    def rates(self, k: int) -> list[float]:
        """P(accept position j | reached it) for j = 1 .. ``k``."""
        out, prev = [], self.prior
        for j in range(k):
            if j < len(self.reached):
                prev = (self.accepted[j] + self.weight[j] * prev) / (self.reached[j] + self.weight[j])
            out.append(prev)
        return out

    def gains(self, k: int) -> list[float]:
        """The expected tokens each of the first ``k`` proposals adds (non-increasing),
        the chance that the proposer offers any included."""
        out, run = [], self.offer_rate()
        for rate in self.rates(k):
            run *= rate
            out.append(run)
        return out
