"""Token-budget scheduler mixing prefill chunks and (speculating) decodes.

Each step spends ``max_num_batched_tokens``: running decodes first (a decode
speculating k tokens costs 1 + k), then prefill chunks fill what is left,
partially prefilled requests before new ones. When the KV pool runs dry the
most recently arrived running request is preempted by recompute: its blocks
are freed and it re-enters the waiting queue to prefill prompt + output again,
all but the last token (``Request.prefill_end``), which it then feeds as a
decode: it resumes with the same step boundaries as if never preempted.

With prefix caching (``prefix``), a request entering the running set skips
the cached blocks its sequence starts with (``PrefixCache.lookup``), as far as
the proposer can follow (``restore``): its first chunk starts after them and
only the uncached tokens are charged to the budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from speculant.config.models import SchedulerConfig
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.block_manager import BlockManager
from speculant.engine.prefix_caching import PrefixCache
from speculant.engine.request import Request, RequestStatus

Restore = Callable[[Request, int], int]
"""``restore(request, num_cached_tokens)``: how many of those leading tokens the
request may skip (a multiple of the block size, at most ``num_cached_tokens``)."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, max_model_len: int,
                 prefix: PrefixCache | None = None) -> None:
        self.config = config
        self.blocks = blocks
        self.max_model_len = max_model_len
        self.prefix = prefix  # None: prefix caching off
        self.on_preempt: Callable[[Request], None] | None = None  # told at once, before any re-admission
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # arrival order

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Forget a finished or aborted request and free its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.blocks.free(request.request_id)

    def schedule(self, draft_lengths: Mapping[str, int] | None = None, restore: Restore | None = None) -> StepBatch:
        """One step's batch. ``draft_lengths``: request id -> most proposals
        that decode may get (the draft-length policy's plan; absent: none).
        ``restore``: cached prefixes may be skipped this step, as far as it
        allows (None: nothing is skipped)."""
        batch = StepBatch()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_decodes(batch, budget, draft_lengths or {})
        self._schedule_prefills(batch, budget, restore)
        return batch

    def cache_committed(self, request: Request) -> None:
        """Key ``request``'s full blocks of committed tokens (after its step is applied)."""
        if self.prefix is not None:
            self.prefix.commit(request)

    # --- decodes -----------------------------------------------------------
    def _spec_len(self, req: Request, k: int, budget: int) -> int:
        room_len = self.max_model_len - req.num_tokens - 1  # keep the bonus token inside max_model_len
        room_out = req.params.max_tokens - req.num_output_tokens - 1  # drafts past max_tokens are waste
        return max(0, min(k, budget - 1, room_len, room_out))

    def _schedule_decodes(self, batch: StepBatch, budget: int, draft_lengths: Mapping[str, int]) -> int:
        """Every running decode first gets its one token; proposals only take
        what is left, so speculation never starves a running decode."""
        pending = sum(1 for r in self.running if r.is_decoding)
        for req in list(self.running):
            if budget < 1:
                break
            if req not in self.running or not req.is_decoding:
                continue
            pending -= 1
            spare = budget - 1 - min(pending, budget - 1)  # one token kept for each later decode
            k_i = self._spec_len(req, draft_lengths.get(req.request_id, 0), spare + 1)
            if not self._reserve(req, req.num_computed_tokens + 1 + k_i, batch):
                continue  # req itself was preempted
            batch.decodes.append(ScheduledRequest(req, 1, k_i, self.blocks.block_table(req.request_id)))
            budget -= 1 + k_i
        return budget

    def _reserve(self, req: Request, num_tokens: int, batch: StepBatch) -> bool:
        """Make room for ``num_tokens`` slots of ``req``, preempting the most
        recent arrivals (possibly ``req`` itself) until it fits."""
        while not self.blocks.can_allocate(req.request_id, num_tokens):
            victim = self.running[-1]
            if victim is req and len(self.running) == 1 and self.blocks.num_free_blocks + \
                    len(self.blocks.block_table(req.request_id)) < self.blocks.num_blocks_for(num_tokens):
                raise RuntimeError(
                    f"request {req.request_id!r} needs {self.blocks.num_blocks_for(num_tokens)} KV blocks "
                    f"but the pool has {self.blocks.num_blocks}; raise cache.num_blocks or cache.memory_gb")
            self._preempt(victim, batch)
            if victim is req:
                return False
        self.blocks.allocate(req.request_id, num_tokens)
        return True

    def _preempt(self, req: Request, batch: StepBatch) -> None:
        self.running.remove(req)
        for lst in (batch.decodes, batch.prefills):
            for s in lst:
                if s.request is req:
                    raise AssertionError("preempted a request already scheduled this step")
        self.blocks.free(req.request_id)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        batch.preempted.append(req)
        if self.on_preempt is not None:
            self.on_preempt(req)

    # --- prefills ----------------------------------------------------------
    def _schedule_prefills(self, batch: StepBatch, budget: int, restore: Restore | None) -> None:
        cfg = self.config
        prefilling = [r for r in self.running if not r.is_decoding]
        for req in prefilling:
            if budget < 1:
                return
            n = self._chunk_len(req, budget, alone=batch.is_empty)
            if n == 0:
                return
            slots = self._slots(req, n)
            if not self.blocks.can_allocate(req.request_id, slots):
                return
            table = self.blocks.allocate(req.request_id, slots)
            batch.prefills.append(ScheduledRequest(req, n, block_table=table))
            budget -= n
        while self.waiting and budget >= 1 and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            prefix = self._lookup(req, restore)
            n = self._admissible(req, budget, batch, prefix)
            if n and prefix:  # the proposer is asked only for an admission that fits: restoring may cost it work
                assert restore is not None  # _lookup finds nothing without it
                kept = restore(req, len(prefix) * self.blocks.block_size) // self.blocks.block_size
                if kept < len(prefix):
                    prefix = prefix[:max(0, kept)]
                    req.num_computed_tokens = len(prefix) * self.blocks.block_size
                    n = self._admissible(req, budget, batch, prefix)
            if n == 0:
                req.num_computed_tokens = 0
                return
            self.waiting.popleft()
            table = self.blocks.allocate(req.request_id, self._slots(req, n), prefix)
            if self.prefix is not None:
                self.prefix.record(req, len(prefix))
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            batch.prefills.append(ScheduledRequest(req, n, block_table=table))
            budget -= n

    def _lookup(self, req: Request, restore: Restore | None) -> list[int]:
        """The cached blocks ``req`` (waiting, holding none) starts with; sets
        its ``num_computed_tokens`` past them."""
        blocks = [] if self.prefix is None or restore is None or self.blocks.has(req.request_id) \
            else self.prefix.lookup(req)
        req.num_computed_tokens = len(blocks) * self.blocks.block_size
        return blocks

    def _admissible(self, req: Request, budget: int, batch: StepBatch, prefix: list[int]) -> int:
        """The first chunk's length if ``req`` can be admitted now after ``prefix``, else 0."""
        n = self._chunk_len(req, budget, alone=batch.is_empty)
        return n if n and self.blocks.can_allocate(req.request_id, self._slots(req, n), prefix) else 0

    @staticmethod
    def _slots(req: Request, n: int) -> int:
        """KV slots a prefill chunk of ``n`` tokens reserves: the chunk's, plus,
        when it ends a recompute one token short, the slot of that last token
        (fed as a decode next step), so a resumed request does not give its
        blocks back and get preempted again at once."""
        end = req.num_computed_tokens + n
        return end + 1 if end == req.prefill_end < req.num_tokens else end

    def _chunk_len(self, req: Request, budget: int, alone: bool) -> int:
        remaining = req.prefill_end - req.num_computed_tokens
        if self.config.enable_chunked_prefill:
            return min(remaining, budget)
        if remaining <= budget:
            return remaining
        # Without chunking a prompt never exceeds the budget (add_request checks), but a
        # preempted request recomputes prompt + output, which may: run it alone.
        return remaining if alone and budget == self.config.max_num_batched_tokens else 0
