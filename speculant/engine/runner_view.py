"""A model runner as plugins see it (``RunnerView``): sequences named by
handles, whose KV blocks this view allocates, grows, forks and frees, and a
forward over spans that name them.

The model runner holds only tensors (weights, the paged caches) and takes
block tables; which block belongs to which sequence is the engine's
bookkeeping (``block_manager.BlockManager``). ``SequenceRunner`` pairs the two
and stands between them and a plugin: a span's handle must be one this view
issued and still holds, or the forward is refused before anything is read or
written (``SequenceHandleError``, naming the handle and the fix). So a plugin
attends only to its own sequences:

- a proposer's own runner (``TargetView.new_runner``) holds the sequences the
  proposer opened or forked, in a block manager of its own;
- the target's view, as a scorer gets it, holds the sequences of the step it
  scores: the engine issues one handle per scheduled request
  (``begin_step``) and withdraws them when the step ends (``end_step``).

Blocks that two sequences share (``fork``, a cached prefix) are copied before
a forward writes into them, so a write never reaches another sequence's K/V.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speculant.engine.block_manager import BlockManager
from speculant.interfaces.data import QuerySpan
from speculant.interfaces.sequence import SequenceHandle, SequenceHandleError
from speculant.interfaces.span_tensors import PagedSpan

if TYPE_CHECKING:  # the runner imports transformers' model classes (~2 s)
    import torch

    from speculant.engine.batch import ScheduledRequest
    from speculant.model.runner import ForwardOutput, ModelRunner

_VIEW_NUMBERS = itertools.count(1)
DIAGNOSTICS = frozenset({
    "model", "tokenizer", "backend", "fast_forward", "graphs", "graphs_off_reason", "linear_report",
    "quant_report", "kernel_report", "self_test", "self_test_deviation", "norms_fused", "norms_kept",
})
"""What the runner reports about itself (its load-time choices and the model), readable through
the view for logs, benchmarks and tests; nothing that reaches the KV caches or an unchecked forward."""


class SequenceRunner:
    """``RunnerView`` over ``runner`` and ``blocks`` (a block manager of its own when None)."""

    def __init__(self, runner: ModelRunner, blocks: BlockManager | None = None, name: str = "runner") -> None:
        self._runner = runner
        self._blocks = blocks if blocks is not None else BlockManager(runner.num_blocks, runner.block_size)
        self.name = f"{name}-{next(_VIEW_NUMBERS)}"
        self._num_issued = 0
        self._live: dict[int, tuple[SequenceHandle, str]] = {}  # serial -> (the handle, its block-manager id)
        self._step: list[int] = []  # serials of the current step's request handles

    # --- what plugins read ---------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._runner.vocab_size

    @property
    def block_size(self) -> int:
        return self._runner.block_size

    @property
    def device(self) -> torch.device:
        return self._runner.device

    @property
    def max_model_len(self) -> int:
        return self._runner.max_model_len

    @property
    def num_blocks(self) -> int:
        return self._blocks.num_blocks

    def __getattr__(self, name: str) -> Any:  # only for names not found above
        if name in DIAGNOSTICS:
            return getattr(self._runner, name)
        raise AttributeError(f"a RunnerView has no {name!r}: plugins reach KV only through sequence handles "
                             f"(open_sequence, grow, fork, free, forward); readable runner reports: "
                             f"{', '.join(sorted(DIAGNOSTICS))}")

    # --- handles -------------------------------------------------------------
    def _issue(self, label: str, seq_id: str | None = None) -> tuple[SequenceHandle, str]:
        serial = self._num_issued
        self._num_issued += 1
        handle = SequenceHandle(self.name, serial, label)
        seq_id = seq_id if seq_id is not None else f"\0{self.name}:{serial}:{label}"  # never a request id
        self._live[serial] = (handle, seq_id)
        return handle, seq_id

    def _seq_id(self, handle: object, where: str) -> str:
        """The block-manager id of ``handle``, after checking this view holds it."""
        if not isinstance(handle, SequenceHandle):
            raise SequenceHandleError(
                f"{where} names {handle!r}, which is not a SequenceHandle; name a sequence by the handle "
                f"runner.open_sequence() or runner.fork() returned (a scorer: ScheduledRequest.sequence); nothing "
                "was read or written")
        if handle.view != self.name:
            raise SequenceHandleError(
                f"{where} names {handle!r}, issued by another runner view; this view is {self.name!r} and "
                "holds only its own sequences: open the sequence on this runner (open_sequence) and use that "
                "handle; nothing was read or written")
        live = self._live.get(handle.serial)
        if live is not None and live[0] is handle:
            return live[1]
        if live is None and 0 <= handle.serial < self._num_issued:
            raise SequenceHandleError(
                f"{where} names {handle!r}, which was freed (or belonged to a step that has ended: a scorer's "
                "sequences are valid only while it scores their step); open a new sequence, or use this "
                "step's ScheduledRequest.sequence; nothing was read or written")
        raise SequenceHandleError(
            f"{where} names {handle!r}, which this view never issued (a handle made by hand, not returned by "
            "open_sequence or fork); use the handle the runner returned; nothing was read or written")

    def open_sequence(self, label: str = "", prefix_keys: Sequence[bytes] = ()) -> tuple[SequenceHandle, int]:
        handle, seq_id = self._issue(label)
        prefix = self._blocks.match_prefix(prefix_keys) if prefix_keys else []
        num_cached = len(prefix) * self.block_size
        if prefix and self._blocks.can_allocate(seq_id, num_cached, prefix):
            self._blocks.allocate(seq_id, num_cached, prefix)
            return handle, num_cached
        return handle, 0

    def can_grow(self, sequence: SequenceHandle, num_tokens: int) -> bool:
        return self._blocks.can_allocate(self._seq_id(sequence, "can_grow"), num_tokens)

    def grow(self, sequence: SequenceHandle, num_tokens: int) -> None:
        self._blocks.allocate(self._seq_id(sequence, "grow"), num_tokens)

    def fork(self, sequence: SequenceHandle, num_tokens: int, label: str = "") -> SequenceHandle:
        parent = self._seq_id(sequence, "fork")
        have = len(self._blocks.block_table(parent)) * self.block_size
        if not 0 <= num_tokens <= have:
            raise ValueError(f"fork({sequence!r}, num_tokens={num_tokens}): the sequence has KV slots for "
                             f"{have} positions; fork at most that many (grow it first)")
        handle, child = self._issue(label)
        self._blocks.fork(parent, child, num_tokens)
        return handle

    def free(self, sequence: SequenceHandle) -> None:
        seq_id = self._seq_id(sequence, "free")
        self._blocks.free(seq_id)
        del self._live[sequence.serial]

    def cache_prefix(self, sequence: SequenceHandle, keys: Sequence[bytes], num_full_blocks: int) -> None:
        self._blocks.cache_blocks(self._seq_id(sequence, "cache_prefix"), keys, num_full_blocks)

    # --- the engine's step -----------------------------------------------------
    def begin_step(self, entries: Sequence[ScheduledRequest]) -> None:
        """Issue each scheduled request a handle (``entry.sequence``) on its own blocks, for this step only."""
        self.end_step()
        for entry in entries:
            entry.sequence, _ = self._issue(entry.request.request_id, entry.request.request_id)
            self._step.append(entry.sequence.serial)

    def end_step(self) -> None:
        """Withdraw the step's request handles (their blocks stay the engine's)."""
        for serial in self._step:
            self._live.pop(serial, None)
        self._step.clear()

    def move_positions(self, moves: Sequence[tuple[SequenceHandle, Sequence[int], Sequence[int]]]) -> int:
        """Engine only (a token tree's accepted path into place, ``engine.trees``):
        for each (sequence, source positions, destination positions), copy the
        K/V at the sources to the destinations in every layer, all reads before
        any write; returns the number of positions moved."""
        size = self.block_size
        src: list[int] = []
        dst: list[int] = []
        for handle, from_pos, to_pos in moves:
            table = self._blocks.block_table(self._seq_id(handle, "move_positions"))
            src += [table[p // size] * size + p % size for p in from_pos]
            dst += [table[p // size] * size + p % size for p in to_pos]
        if src:
            self._runner.move_kv(src, dst)
        return len(src)

    # --- forward ---------------------------------------------------------------
    def forward(self, spans: list[QuerySpan], want_hidden: bool = False) -> ForwardOutput:
        """Check every span's handle and slots, copy shared blocks it writes, then run the model."""
        resolved = []
        for i, span in enumerate(spans):
            if not isinstance(span, QuerySpan):
                raise TypeError(f"span {i} of the forward is a {type(span).__name__}; RunnerView.forward takes "
                                "QuerySpan(sequence, start, token_ids, logits_at), naming a sequence handle")
            seq_id = self._seq_id(span.sequence, f"span {i} of the forward")
            have = len(self._blocks.block_table(seq_id)) * self.block_size
            if span.start < 0 or span.end > have:
                raise IndexError(
                    f"span {i} of the forward writes positions {span.start}..{span.end - 1} of {span.sequence!r}, "
                    f"which has KV slots for positions 0..{have - 1}; call runner.grow(handle, {span.end}) "
                    "first (and start at a position >= 0); nothing was read or written")
            resolved.append(seq_id)
        copies = [pair for span, seq_id in zip(spans, resolved)
                  for pair in self._blocks.unshare(seq_id, span.start, span.end)]
        self._runner.copy_blocks(copies)
        paged = [PagedSpan(list(self._blocks.block_table(seq_id)), s.start, s.token_ids, s.logits_at,
                           s.positions, s.ancestor_mask) for s, seq_id in zip(spans, resolved)]
        return self._runner.forward(paged, want_hidden)
