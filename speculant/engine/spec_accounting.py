"""Per-request speculation accounting after a step: what each request's
speculation cost and did, beyond the verify counters ``commit.apply`` records.

- A decode that verified no proposals (its k was 0: the draft-length policy, its
  own ``SamplingParams.speculative``, the budget, or a proposer that had none)
  counts one step with speculation off; one that was asked for proposals
  (k > 0 after scheduling) and got none also counts as unoffered, which the
  adaptive policy tells apart from a rejection (``acceptance_estimate``).
- The proposer's time in the step is shared among the requests it worked for:
  in proportion to the tokens drafted for each decode, or, in a step that drafted
  nothing (a stateful proposer following prefill chunks), equally among the
  step's entries that may speculate (a request with speculation turned off by
  its ``SamplingParams.speculative`` costs its proposer nothing and is charged nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

from speculant.engine.batch import StepBatch
from speculant.engine.commit import Plan


def account_step(batch: StepBatch, plans: Sequence[Plan], propose_s: float, speculating: bool) -> int:
    """Record off-steps and propose time on the requests of ``plans`` (already
    applied); returns the tokens drafted in the step. ``speculating``: the
    engine has a proposer (without one, nothing is counted)."""
    if not speculating:
        return 0
    decodes = {id(d) for d in batch.decodes}
    drafted = {id(p.entry): p.outcome.num_drafted for p in plans if id(p.entry) in decodes}
    total = sum(drafted.values())
    enabled = sum(1 for e in batch.entries if e.request.params.speculation.enabled)
    for p in plans:
        stats = p.entry.request.spec_stats
        if id(p.entry) in decodes and p.outcome.num_drafted == 0:
            stats.num_off_steps += 1
            stats.num_unoffered_steps += p.entry.num_spec_tokens > 0
        if total:
            stats.propose_s += propose_s * drafted.get(id(p.entry), 0) / total
        elif p.entry.request.params.speculation.enabled:
            stats.propose_s += propose_s / enabled
    return total
