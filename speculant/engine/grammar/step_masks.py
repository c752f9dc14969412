"""Grammar masks inside the speculative step.

Per step, for the requests with a grammar (``Request.grammar``):

1. ``StructuredOutputs.begin`` (before the forward, in the stepping thread)
   syncs each matcher with its request's committed output, then cuts each
   decode's proposals to the prefix the grammar allows (``cut_proposals``)
   where that keeps acceptance exact: greedy requests, and proposals without
   draft probabilities (one-hot: a forbidden one-hot proposal is rejected with
   certainty and the recovered token is drawn from p itself, as for a cut
   run's bonus row). A sampling request's proposals drawn from a full draft
   distribution are not cut: the mask rejects them at verification, keeping
   the rejection sampler's residual exact.
2. The masks are computed in a worker thread while the target runs: for each
   decode one row per target row it scores (the committed state, then after
   each proposal in order: ``1 + lens[i]`` rows), one row for a sampling
   prefill chunk; the matcher advances along the proposal and is rolled back.
   Rows after a forbidden proposal stay all-allowed: acceptance never reads
   them (that proposal is rejected).
3. ``StepGrammar.apply`` sets every forbidden logit to -inf in a copy of the
   logits, before sampling or the acceptance method sees them, so a forbidden
   proposal is rejected like any other mismatch; the acceptance method's p is
   the masked, renormalized distribution and the draft's q stays as proposed.

A request whose grammar fails (``GrammarFault``) is reported in ``faults``;
its rows stay unmasked and the step runner fails that request alone.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from speculant.engine.grammar.compiler import GrammarCompiler
from speculant.engine.grammar.request_grammar import GrammarFault, RequestGrammar
from speculant.engine.trees import chains_for
from speculant.interfaces import Proposals, Scores

if TYPE_CHECKING:
    from speculant.config.structured import StructuredOutput
    from speculant.engine.batch import StepBatch

ALL_ALLOWED = -1  # an int32 word with every bit set


class StructuredOutputs:
    """The engine's structured-output machinery: compiler, per-request states, mask worker."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.compiler = GrammarCompiler(hf_tokenizer, vocab_size, eos_token_ids)
        self.vocab_size = vocab_size  # columns of the logits (the mask's bits past them are dropped)
        self._worker: ThreadPoolExecutor | None = None
        self.mask_s = 0.0  # worker time computing masks (overlapped with the forward)
        self.mask_cpu_s = 0.0  # the worker thread's CPU time for them (what other jobs cannot inflate)
        self.wait_s = 0.0  # stepping thread's time waiting for masks after the forward
        self.apply_s = 0.0  # stepping thread's time applying masks
        self.num_mask_rows = 0
        self.num_cut_tokens = 0  # proposals cut before verification

    def new_state(self, spec: StructuredOutput) -> RequestGrammar:
        """A request's grammar state (compiles or reuses the cached grammar); raises GrammarError."""
        return RequestGrammar(spec, self.compiler.matcher(spec))

    def begin(self, batch: StepBatch, proposals: Proposals) -> StepGrammar | None:
        """Sync, cut and start the masks of ``batch``; None when no entry has a grammar."""
        entries = [e for e in batch.entries if e.request.grammar is not None]
        if not entries:
            return None
        faults: dict[str, str] = {}
        for e in entries:
            try:
                assert e.request.grammar is not None
                e.request.grammar.sync(e.request.output_token_ids)
            except GrammarFault as exc:
                faults[e.request.request_id] = str(exc)
        # a grammar walks one sequence: a structured decode's token tree is cut to its first-child chain
        proposals = chains_for(proposals, [i for i, d in enumerate(batch.decodes) if d.request.grammar is not None])
        proposals = self.cut_proposals(batch, proposals, faults)
        jobs = self._jobs(batch, proposals, faults)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speculant-grammar")
        future = self._worker.submit(self._compute, jobs)
        return StepGrammar(self, proposals, future, faults, [rid for rid, _, _ in jobs])

    def cut_proposals(self, batch: StepBatch, proposals: Proposals, faults: dict[str, str]) -> Proposals:
        """Proposals cut to their grammar-valid prefix where that keeps acceptance exact (module doc)."""
        if proposals.num_draft_tokens == 0:
            return proposals
        cu = proposals.cu_num_draft_tokens.tolist()
        ids = proposals.token_ids.tolist()
        keep: list[int] = []
        lens: list[int] = []
        cut = 0
        for i, d in enumerate(batch.decodes):
            row = ids[cu[i]:cu[i + 1]]
            n = len(row)
            g = d.request.grammar
            if g is not None and d.request.request_id not in faults and (
                    d.request.params.greedy or proposals.probs is None):
                n = g.valid_prefix(row)
            cut += len(row) - n
            keep.extend(range(cu[i], cu[i] + n))
            lens.append(n)
        if not cut:
            return proposals
        self.num_cut_tokens += cut
        device = proposals.token_ids.device
        index = torch.tensor(keep, dtype=torch.long, device=device)
        new_cu = torch.tensor([0] + lens, dtype=torch.long, device=device).cumsum(0)
        probs = proposals.probs[index] if proposals.probs is not None else None
        parents = proposals.parents[index] if proposals.parents is not None else None
        return Proposals(proposals.token_ids[index], new_cu, probs, parents)

    def _jobs(self, batch: StepBatch, proposals: Proposals, faults: dict[str, str]) -> list[tuple[str, Any, list[int]]]:
        """(request id, grammar, proposal) per entry whose rows get masks."""
        jobs: list[tuple[str, Any, list[int]]] = []
        for p in batch.prefills:
            g = p.request.grammar
            if g is not None and p.samples and p.request.request_id not in faults:
                jobs.append((p.request.request_id, g, []))
        cu = proposals.cu_num_draft_tokens.tolist()
        ids = proposals.token_ids.tolist()
        for i, d in enumerate(batch.decodes):
            g = d.request.grammar
            if g is not None and d.request.request_id not in faults:
                jobs.append((d.request.request_id, g, ids[cu[i]:cu[i + 1]]))
        return jobs

    def _compute(self, jobs: list[tuple[str, Any, list[int]]]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Worker thread: each job's ``1 + len(proposal)`` mask rows [rows, W] int32, and new faults."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        num_rows = sum(1 + len(draft) for _, _, draft in jobs)
        num_words = (self.compiler.tokenizer.vocab_size + 31) // 32
        # numpy, not torch, in this thread: a torch op here would start an OpenMP team of its own
        bitmask = np.full((max(num_rows, 1), num_words), ALL_ALLOWED, dtype=np.int32)
        starts, row = [], 0
        for _, _, draft in jobs:
            starts.append(row)
            row += 1 + len(draft)
        faults: dict[str, str] = {}
        for job, s in zip(jobs, starts):
            try:
                _fill(job[1].matcher, job[2], bitmask, s)
            except Exception as exc:  # noqa: BLE001 - a fault kept with its request
                faults[job[0]] = f"its {job[1].spec.kind} grammar failed while computing its token masks: {exc}"
        masks = {}
        # a state allowing no token the model can emit (within the logits' columns) is a fault
        nonempty = _any_allowed(bitmask[starts], self.vocab_size) if jobs else []
        for j, ((rid, g, draft), s) in enumerate(zip(jobs, starts)):
            if rid in faults:
                continue
            try:
                g.check()
                if not nonempty[j]:
                    raise GrammarFault(f"its {g.spec.kind} grammar allows no token after "
                                       f"{len(g.tokens)} output tokens")
            except GrammarFault as exc:
                faults[rid] = str(exc)
                continue
            masks[rid] = torch.from_numpy(bitmask[s:s + 1 + len(draft)])  # shares the memory: no torch op
        self.mask_s += time.perf_counter() - t0
        self.mask_cpu_s += time.thread_time() - cpu0
        self.num_mask_rows += num_rows
        return masks, faults


def _any_allowed(rows: np.ndarray,  # [R, W] int32 bitmask rows
                 vocab_size: int) -> list[bool]:
    """Whether each row allows a token below ``vocab_size`` (the logits' columns)."""
    full, rem = divmod(vocab_size, 32)
    out = (rows[:, :full] != 0).any(axis=1)
    if rem:
        out |= (rows[:, full].astype(np.int64) & ((1 << rem) - 1)) != 0
    return [bool(x) for x in out]


def _fill(matcher: Any, draft: list[int], bitmask: np.ndarray,  # [rows, W] int32, filled in place
          start: int) -> None:
    """Rows ``start ..``: the mask at the matcher's state, then after each allowed proposal in
    order (the matcher advances tentatively and is rolled back). Rows after a forbidden proposal
    are left as they are (all allowed). One matcher at a time: llguidance's thread-pool executor
    cost ~14 ms of CPU per call here (2 cores), far more than the masks themselves (~0.1 ms)."""
    assert bitmask.flags["C_CONTIGUOUS"]
    fill = _numpy_helpers().fill_next_token_bitmask
    n = int(matcher.validate_tokens(draft)) if draft else 0
    for j in range(n):
        fill(matcher, bitmask, start + j)
        if not matcher.consume_token(draft[j]):
            raise GrammarFault(f"the matcher refused proposal {draft[j]} it had validated: {matcher.get_error()}")
    fill(matcher, bitmask, start + n)
    if n and not matcher.rollback(n):
        raise GrammarFault(f"the matcher could not roll back {n} proposals: {matcher.get_error()}")


def _numpy_helpers() -> Any:
    import llguidance.numpy

    return llguidance.numpy


@dataclass
class StepGrammar:
    """One step's grammar work: the cut proposals, the pending masks, the faults."""

    owner: StructuredOutputs
    proposals: Proposals
    future: Future
    faults: dict[str, str] = field(default_factory=dict)
    request_ids: list[str] = field(default_factory=list)  # the requests whose masks the worker computes
    _masks: dict[str, torch.Tensor] | None = None

    def wait(self) -> None:
        """Block until the worker is done with this step's matchers (its result is kept)."""
        self.future.exception()

    def masks(self) -> dict[str, torch.Tensor]:
        """Each request's mask rows (waits for the worker)."""
        if self._masks is None:
            t0 = time.perf_counter()
            try:
                masks, faults = self.future.result()
            except Exception as exc:  # noqa: BLE001 - the worker itself failed: its requests fail, no others
                masks = {}
                faults = {rid: f"its grammar masks could not be computed: {type(exc).__name__}: {exc}"
                          for rid in self.request_ids}
            self.owner.wait_s += time.perf_counter() - t0
            self.faults.update(faults)
            self._masks = masks
        return self._masks

    def apply(self, batch: StepBatch, proposals: Proposals, scores: Scores) -> Scores:
        """``scores`` with every grammar-forbidden logit at -inf (a copy where rows change).
        ``proposals`` may be empty (a retry without speculation): row 0 of each decode then."""
        masks = self.masks()
        t0 = time.perf_counter()
        prefill_rows: list[int] = []
        prefill_masks: list[torch.Tensor] = []
        reporting = [p for p in batch.prefills if p.reports]
        for r, p in enumerate(reporting):
            m = masks.get(p.request.request_id)
            if m is not None and p.samples:
                prefill_rows.append(r)
                prefill_masks.append(m[:1])
        decode_rows: list[int] = []
        decode_masks: list[torch.Tensor] = []
        lens = proposals.lens.tolist() if batch.decodes else []
        cu = scores.cu_num_logits.tolist()
        for i, d in enumerate(batch.decodes):
            m = masks.get(d.request.request_id)
            if m is not None:
                rows = 1 + lens[i]
                assert rows <= m.shape[0], "mask rows computed for a shorter proposal than the one scored"
                decode_rows.extend(range(cu[i], cu[i] + rows))
                decode_masks.append(m[:rows])
        out = scores
        if prefill_rows:
            out = replace(out, prefill_logits=_masked(scores.prefill_logits, prefill_rows, prefill_masks))
        if decode_rows:
            out = replace(out, decode_logits=_masked(scores.decode_logits, decode_rows, decode_masks))
        self.owner.apply_s += time.perf_counter() - t0
        return out


def _masked(logits: torch.Tensor,  # [R, V]
            rows: list[int], masks: list[torch.Tensor]) -> torch.Tensor:  # [R, V] copy
    bitmask = torch.cat(masks).to(logits.device)  # [len(rows), W] int32
    allowed = unpack_bitmask(bitmask, logits.shape[1])  # [len(rows), V] bool
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    out = logits.clone()
    out[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return out


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack_bitmask(bitmask: torch.Tensor,  # [R, W] int32, token t is bit t % 32 of word t // 32
                   vocab_size: int) -> torch.Tensor:  # [R, vocab_size] bool
    shifts = _SHIFTS.get(bitmask.device)
    if shifts is None:
        shifts = _SHIFTS.setdefault(bitmask.device, torch.arange(32, dtype=torch.int32, device=bitmask.device))
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
