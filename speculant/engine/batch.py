"""What the scheduler hands to the rest of the step.

A step's batch is ordered prefill chunks first, then decodes ("prefill |
decode"). Every later stage (proposer, scorer, acceptance, commit) walks the
same two lists, so no index bookkeeping is needed to map results back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculant.engine.request import Request
from speculant.interfaces import batch as views
from speculant.interfaces.sequence import SequenceHandle


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step.

    ``num_new_tokens`` tokens of the request's own sequence are fed, starting
    at ``start`` (the request's ``num_computed_tokens`` when scheduled).
    Decodes feed one token (the last sampled one) plus ``num_spec_tokens``
    proposals budgeted for them. ``start`` and ``samples`` are fixed at
    scheduling time, so they stay true while the step commits.
    """

    request: Request
    num_new_tokens: int
    num_spec_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    """The request's KV block ids (the scheduler's, after it allocated this step's slots)."""
    sequence: SequenceHandle | None = None
    """The handle plugins name the request's KV by this step (``SequenceRunner.begin_step``)."""
    start: int = field(init=False)
    """Position of the first token fed this step."""
    samples: bool = field(init=False)
    """True when this step reaches the end of the sequence (terminal chunk or
    decode), so a token is sampled; False for a non-terminal chunk."""
    reports: bool = field(init=False)
    """True when the entry's last row goes into ``Scores``: it samples, or it
    is the chunk that ends a recompute one token short of the sequence
    (``Request.prefill_end``), whose hidden state a hidden-state proposer needs
    to resume proposing exactly where the request was preempted."""

    def __post_init__(self) -> None:
        req = self.request
        self.start = req.num_computed_tokens
        end = self.start + self.num_new_tokens
        self.samples = end == req.num_tokens
        self.reports = self.samples or (req.num_output_tokens > 0 and end == req.num_tokens - 1)

    @property
    def new_token_ids(self) -> list[int]:
        return self.request.token_ids[self.start:self.start + self.num_new_tokens]

    def view(self) -> views.ScheduledRequest:
        """This entry as plugins see it (read-only)."""
        return views.ScheduledRequest(self.request.view, self.num_new_tokens, self.num_spec_tokens, self.start,
                                      self.samples, self.reports, self.sequence)


@dataclass(slots=True)
class StepBatch:
    prefills: list[ScheduledRequest] = field(default_factory=list)
    decodes: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    _view: views.StepBatch | None = field(default=None, repr=False)

    def view(self) -> views.StepBatch:
        """The batch as plugins see it (built once; read-only views of the entries)."""
        if self._view is None:
            self._view = views.StepBatch(tuple(p.view() for p in self.prefills),
                                         tuple(d.view() for d in self.decodes))
        return self._view

    @property
    def entries(self) -> list[ScheduledRequest]:
        return self.prefills + self.decodes

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens + s.num_spec_tokens for s in self.entries)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def num_spec_tokens(self) -> list[int]:
        return [d.num_spec_tokens for d in self.decodes]
