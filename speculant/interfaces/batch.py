"""What a plugin receives about a step: read-only views of the batch.

A step's batch is ordered prefill chunks first, then decodes ("prefill |
decode"), as the engine scheduled it. Plugins get ``StepBatch`` of
``ScheduledRequest`` entries, each with a ``RequestView`` of its request:

- ``RequestView`` reads the engine's request (token ids, sampling settings,
  prefix-cache keys, whether it finished) and offers no way to change it. It
  is live: read during ``commit`` it already holds the step's accepted tokens.
  One view per request, so ``is`` tells whether a request is the same one.
- ``TokenIds`` is a read-only sequence of token ids whose length is fixed
  when it is read (O(1), no copy); slices are plain lists.
- ``proposer_state`` is a dict the proposer may keep per request: the engine
  empties it whenever it calls ``Proposer.free`` for that request.

Nothing here imports the engine: the engine builds these from its own objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, overload

if TYPE_CHECKING:
    from speculant.interfaces.sampling_params import SamplingParams
    from speculant.interfaces.sequence import SequenceHandle


class TokenIds(Sequence[int]):
    """Read-only view of the first ``len(self)`` ids of a request's token list."""

    __slots__ = ("_ids", "_n")

    def __init__(self, ids: list[int], n: int | None = None) -> None:
        self._ids = ids
        self._n = len(ids) if n is None else n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> list[int]: ...

    def __getitem__(self, key: int | slice) -> int | list[int]:
        if isinstance(key, slice):
            start, stop, step = key.indices(self._n)
            if step < 0 and stop < 0:  # reversed down to index 0 included
                return self._ids[start::step]
            return self._ids[start:stop:step]
        i = key + self._n if key < 0 else key
        if not 0 <= i < self._n:
            raise IndexError(f"token index {key} out of range for {self._n} tokens")
        return self._ids[i]

    def __iter__(self) -> Iterator[int]:
        ids = self._ids
        return (ids[i] for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (TokenIds, list, tuple)):
            return len(other) == self._n and list(other) == self.tolist()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.tolist()))

    def tolist(self) -> list[int]:
        """A copy, as a plain list."""
        return self._ids[:self._n]

    def __repr__(self) -> str:
        return f"TokenIds({self.tolist()!r})"


class RequestData(Protocol):
    """What the engine's request holds that a view reads (``speculant.engine.request.Request``)."""

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    seed: int
    block_hashes: list[bytes]
    finish_reason: str | None

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def finished(self) -> bool: ...


class RequestView:
    """One request as a plugin sees it: read-only, live."""

    __slots__ = ("_req", "proposer_state")

    def __init__(self, request: RequestData) -> None:
        self._req = request
        # the proposer's own per-request state, emptied whenever the engine calls Proposer.free for it
        self.proposer_state: dict[str, Any] = {}

    @property
    def request_id(self) -> str:
        return self._req.request_id

    @property
    def token_ids(self) -> TokenIds:
        """Prompt + output so far."""
        return TokenIds(self._req.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._req.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return self._req.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self._req.token_ids) - self._req.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        """A copy of the prompt's tokens."""
        return self._req.token_ids[:self._req.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        """A copy of the generated tokens."""
        return self._req.token_ids[self._req.num_prompt_tokens:]

    @property
    def params(self) -> SamplingParams:
        """The request's sampling settings (never change them)."""
        return self._req.params

    @property
    def seed(self) -> int:
        """Effective seed (``params.seed``, or one the engine drew): what ``sampling`` draws with."""
        return self._req.seed

    @property
    def block_hashes(self) -> tuple[bytes, ...]:
        """Prefix-cache keys of the leading full blocks of ``token_ids`` computed so far."""
        return tuple(self._req.block_hashes)

    @property
    def finished(self) -> bool:
        return self._req.finished

    @property
    def finish_reason(self) -> str | None:
        return self._req.finish_reason

    def __repr__(self) -> str:
        return f"RequestView({self.request_id!r}, num_tokens={self.num_tokens})"


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request's share of a step.

    ``num_new_tokens`` tokens of the request's sequence are fed from
    position ``start``; a decode feeds its last sampled token plus up to
    ``num_spec_tokens`` proposals (its speculation budget this step).
    """

    request: RequestView
    num_new_tokens: int
    num_spec_tokens: int
    start: int
    """Position of the first token fed this step."""
    samples: bool
    """This step reaches the end of the sequence, so a token is sampled."""
    reports: bool
    """The entry's last row goes into ``Scores`` (it samples, or it ends a
    recompute one token short, whose hidden state a proposer resumes from)."""
    sequence: SequenceHandle | None = None
    """The request's sequence on the target's runner this step: what a
    scorer's spans name (``QuerySpan.sequence``); the target's ``RunnerView``
    refuses it once the step ends, and every other runner refuses it always.
    None outside an engine step (a batch a test builds by hand)."""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def positions(self) -> range:
        """Positions of the tokens fed this step (proposals not included)."""
        return range(self.start, self.start + self.num_new_tokens)

    @property
    def new_token_ids(self) -> list[int]:
        return self.request.token_ids[self.start:self.start + self.num_new_tokens]

    @property
    def proposer_state(self) -> dict[str, Any]:
        """The proposer's per-request state (``RequestView.proposer_state``)."""
        return self.request.proposer_state


@dataclass(frozen=True, slots=True)
class StepBatch:
    """A step's batch: prefill chunks, then decodes."""

    prefills: tuple[ScheduledRequest, ...] = ()
    decodes: tuple[ScheduledRequest, ...] = ()
    entries: tuple[ScheduledRequest, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", self.prefills + self.decodes)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens + s.num_spec_tokens for s in self.entries)

    @property
    def num_spec_tokens(self) -> list[int]:
        return [d.num_spec_tokens for d in self.decodes]

    @property
    def is_empty(self) -> bool:
        return not self.entries

