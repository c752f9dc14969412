"""Run a request set through one engine schedule and check every request
against the same request run alone (tests/spec/test_schedule_properties.py,
test_schedule_regressions.py).

``Setup`` is an engine configuration, ``Req`` one request with its arrival
step and, optionally, the step at which it is aborted. ``ScheduleChecker.check``
drives ``LLMEngine.add_request / step / abort_request`` by hand and asserts:

- every request ends exactly once: finished by ``step()`` or aborted (an abort
  of a request that had already finished returns False), nothing is left
  unfinished, and no output arrives for a request after it finished;
- the KV pools keep their accounting after every step (empty + cached + in
  use = total, reference counts equal the block tables: ``BlockManager.check``)
  and are idle again at the end: the target's and, for ``draft_model``, the
  draft's own pool have no block in use and hold no block table (blocks kept
  by the prefix cache count as free);
- each step has the right shape (``check_step_shape``: budget, k, max_num_seqs,
  no starved decode) and each finished request has the log-probs it asked for;
- each request's streamed token ids only ever grow;
- each surviving request equals the same request run alone in a roomy engine
  (big budget, big pool, block size 16, prefix caching off) with the same speculation config
  (proposer, scorer, k, acceptance, draft confidence threshold); greedy requests also equal the roomy
  engine without speculation. An aborted request's last streamed tokens are
  a prefix of its solo output.

What "equal" means:

- Greedy: same tokens, text, finish and stop reason. Two fp32 forwards that
  batch differently may break a near-tie of the top two logits differently;
  at the first differing token the two choices' logits are looked up in
  transformers' own forward (teacher-forced), and a gap within
  ``greedy_compare.NEAR_TIE_RTOL`` ends the comparison there (as
  tests/greedy_compare.py does against ``generate()``).
- Seeded sampling: exactly equal. Randomness is per request, keyed by the
  request's seed and output length, so batch composition does not matter.
  Three things change a speculating request's draw, and such requests are not
  compared (the checker's ``events`` count them): a step in which its k was
  trimmed below what it gets alone (budget, ``disable_by_batch_size``; a
  different number of proposals verifies a different but equally valid draw,
  as test_spec_sampling.py notes), and proposals that depend on other
  requests (the ``adaptive`` draft-length policy, whose k follows the batch;
  the ``suffix`` proposer's global cache of finished outputs). Preemption no
  longer is one (issue 13 item 4, ``COMPARE_PREEMPTED_SPEC_SAMPLING`` below).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fast_paths import expect_fast_forward
from greedy_compare import NEAR_TIE_RTOL, HFReference
from speculant import LLM, SamplingParams

# Issue 13 item 4 (fixed): a preempted request used to re-prefill prompt + output and
# sample its next token plainly in the terminal chunk, where the uninterrupted run
# verified k proposals at that output position, so seeded sampled output differed from
# the request run alone. A recompute now stops one token short and resumes as a decode
# (Request.prefill_end), so preempted speculating requests are compared too.
# test_schedule_regressions.py keeps the reproducers.
COMPARE_PREEMPTED_SPEC_SAMPLING = True

ROOMY_BLOCK_SIZE = 16
ROOMY_ENGINES_KEPT = 6  # each holds a KV pool and, with a draft, a second model


@dataclass
class Req:
    """One request: prompt token ids, sampling settings, the engine step before
    which it is added, and the step before which it is aborted (None: never)."""

    prompt: list[int]
    params: SamplingParams
    arrive_at: int = 0
    abort_at: int | None = None


SUFFIX_CACHED = ("suffix", "eagle_suffix", "draft_suffix")  # proposers with suffix's global output cache


def proposer_parts(proposer) -> list:
    """The proposer, or the parts of a hybrid (each holds its own state)."""
    if proposer is None:
        return []
    return list(getattr(proposer, "parts", [proposer]))


def pools(eng) -> list:
    """The target's KV pool, then a draft model's own (if any)."""
    found = [eng.blocks]
    for part in proposer_parts(eng.spec.proposer):
        draft_runner = getattr(part, "runner", None)
        if draft_runner is not None:
            found.append(draft_runner._blocks)
    return found


@dataclass
class Setup:
    """An engine configuration; ``proposer=None`` means no speculation (k is then 0)."""

    proposer: str | None = None  # None | "ngram" | "suffix" | "draft_model" | "eagle" | "eagle_suffix" | ...
    k: int = 0
    scorer: str = "mqa"
    acceptance: str = "rejection"
    draft_confidence: float = 0.0  # draft_model's / eagle's confidence_threshold
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 8
    enable_chunked_prefill: bool = True
    disable_by_batch_size: int | None = None
    draft_length: str = "fixed"  # the policy: "fixed" | "adaptive"
    suffix_cache: bool = True  # suffix: keep the global cache of finished outputs
    prefix_caching: bool = True  # cache.enable_prefix_caching (the solo references run without)
    tree_width: int = 1  # speculative.tree_width: > 1 for token trees
    max_tree_tokens: int = 16  # speculative.max_tree_tokens (a decode's ceiling with trees)

    @property
    def spec_key(self) -> tuple | None:
        if self.proposer is None:
            return None
        return (self.proposer, self.k, self.scorer, self.acceptance, self.draft_confidence, self.draft_length,
                self.suffix_cache, self.tree_width, self.max_tree_tokens)

    @property
    def max_spec_tokens(self) -> int:
        """The most proposals a decode may get in a step (tree nodes with trees)."""
        return 0 if self.proposer is None else self.max_tree_tokens if self.tree_width > 1 else self.k


@dataclass
class Final:
    """What a finished request returned."""

    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: str | int | None

    @classmethod
    def of(cls, out) -> Final:
        o = out.outputs[0]
        return cls(list(o.token_ids), o.text, o.finish_reason, o.stop_reason)


@dataclass
class Trace:
    """What one scheduled run did, per request id."""

    finals: dict[str, Final] = field(default_factory=dict)
    streamed: dict[str, list[int]] = field(default_factory=dict)  # last token ids seen in a step output
    aborted: set[str] = field(default_factory=set)
    trimmed: set[str] = field(default_factory=set)  # some step gave it fewer proposals than alone
    preempted: set[str] = field(default_factory=set)
    preempted_at: dict[str, list[int]] = field(default_factory=dict)  # output lengths when preempted
    num_steps: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens whose prefill the prefix cache saved


def spec_dict(spec_key: tuple | None, draft_dir: Path, disable_by_batch_size: int | None = None,
              eagle_dir: Path | None = None) -> dict:
    if spec_key is None:
        return {}
    proposer, k, scorer, acceptance, draft_confidence, draft_length, suffix_cache, width, tree_tokens = spec_key
    cfg = {"proposer": proposer, "num_speculative_tokens": k, "scorer": scorer, "acceptance": acceptance,
           "draft_length": {"policy": draft_length, **({"token_cost": 0.3} if draft_length == "adaptive" else {})}}
    if width > 1:
        cfg |= {"tree_width": width, "max_tree_tokens": tree_tokens}
    suffix = {} if suffix_cache else {"max_cached_requests": 0}
    draft = {"model": str(draft_dir), "confidence_threshold": draft_confidence}
    eagle = {"path": str(eagle_dir), "confidence_threshold": draft_confidence}
    if proposer == "suffix":
        cfg["proposer_options"] = suffix
    if proposer == "draft_model":
        cfg["proposer_options"] = draft
    if proposer == "eagle":
        cfg["proposer_options"] = eagle
    if proposer in ("eagle_suffix", "draft_suffix"):  # min_match_len 1: the suffix part drafts often
        part = {"eagle": eagle} if proposer == "eagle_suffix" else {"draft": draft}
        cfg["proposer_options"] = {"suffix": suffix, "min_match_len": 1, **part}
    if disable_by_batch_size is not None:
        cfg["disable_by_batch_size"] = disable_by_batch_size
    return cfg


def check_step_shape(batch, decoding: list, setup: Setup, k: int, num_running: int) -> None:
    """One scheduled step: within the token budget (a preempted request
    recomputing more than the budget with chunking off runs alone, the
    scheduler's documented exception), 0 <= k_i <= k, at most ``max_num_seqs``
    running, and every request decoding before the step either decodes in it
    or was preempted (speculation never starves a decode)."""
    cost = batch.num_tokens
    lone_recompute = not setup.enable_chunked_prefill and len(batch.prefills) == 1 and not batch.decodes
    assert cost <= setup.max_num_batched_tokens or lone_recompute, (
        f"step spends {cost} tokens, budget {setup.max_num_batched_tokens}")
    assert all(0 <= d.num_spec_tokens <= k for d in batch.decodes), [d.num_spec_tokens for d in batch.decodes]
    assert num_running <= setup.max_num_seqs, f"{num_running} running, max_num_seqs {setup.max_num_seqs}"
    decoded = {id(d.request) for d in batch.decodes} | {id(r) for r in batch.preempted}
    starved = [r.request_id for r in decoding if id(r) not in decoded]
    assert not starved, f"running decodes {starved} got no token this step"


def check_logprobs(out, params: SamplingParams) -> None:
    """Requested log-probs: one entry per output token, holding that token and at
    most ``logprobs`` others (values are not compared across runs: fp32 noise)."""
    o = out.outputs[0]
    if params.logprobs is None:
        assert o.logprobs is None, f"{out.request_id}: log-probs returned without being asked for"
        return
    assert o.logprobs is not None and len(o.logprobs) == len(o.token_ids), (
        f"{out.request_id}: {0 if o.logprobs is None else len(o.logprobs)} log-prob entries for "
        f"{len(o.token_ids)} tokens")
    for tok, entry in zip(o.token_ids, o.logprobs):
        assert tok in entry and len(entry) <= params.logprobs + 1, f"{out.request_id}: log-probs {entry} for {tok}"


def params_key(p: SamplingParams) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list) else tuple(v.items()) if isinstance(v, dict) else v)
                 for k, v in asdict(p).items())


class ScheduleChecker:
    """Runs examples against ``target_dir`` (draft: ``draft_dir``), caching roomy
    reference engines (a few) and solo results (all) across examples."""

    def __init__(self, target_dir: Path, draft_dir: Path, eagle_dir: Path | None = None) -> None:
        self.target_dir, self.draft_dir = Path(target_dir), Path(draft_dir)
        self.eagle_dir = eagle_dir
        self._hf: HFReference | None = None
        self._roomy: OrderedDict[tuple, LLM] = OrderedDict()
        self._solo: dict[tuple, Final] = {}
        self.events: list[str] = []
        self.compare_preempted_spec_sampling = COMPARE_PREEMPTED_SPEC_SAMPLING

    # --- references ----------------------------------------------------------
    @property
    def hf(self) -> HFReference:
        if self._hf is None:
            self._hf = HFReference(self.target_dir)
        return self._hf

    def roomy(self, spec_key: tuple | None, max_model_len: int | None) -> LLM:
        key = (spec_key, max_model_len)
        if key in self._roomy:
            self._roomy.move_to_end(key)
            return self._roomy[key]
        mml = max_model_len or 256
        llm = LLM(model=str(self.target_dir), block_size=ROOMY_BLOCK_SIZE, max_model_len=max_model_len,
                  num_blocks=2 * math.ceil(mml / ROOMY_BLOCK_SIZE) + 2, max_num_batched_tokens=512,
                  max_num_seqs=8, speculative=spec_dict(spec_key, self.draft_dir, eagle_dir=self.eagle_dir),
                  enable_prefix_caching=False)
        self._roomy[key] = llm
        while len(self._roomy) > ROOMY_ENGINES_KEPT:
            self._roomy.popitem(last=False)
        return llm

    def solo(self, req: Req, spec_key: tuple | None, max_model_len: int | None) -> Final:
        """``req`` alone in a roomy engine. ``max_model_len`` is kept only where
        it binds this request (otherwise the model's own, 256, behaves the same:
        the request never gets near it and its k is never trimmed by it)."""
        if max_model_len is not None and len(req.prompt) + req.params.max_tokens <= max_model_len:
            max_model_len = None
        key = (tuple(req.prompt), params_key(req.params), spec_key, max_model_len)
        if key not in self._solo:
            eng = self.roomy(spec_key, max_model_len).engine
            rid = eng.add_request(None, list(req.prompt), req.params)
            final, steps = None, 0
            while eng.has_unfinished_requests():
                steps += 1
                assert steps <= 1000, "a solo run did not finish in 1000 steps"
                for out in eng.step():
                    if out.request_id == rid and out.finished:
                        final = Final.of(out)
            assert final is not None, "solo run ended without a finished output"
            self._solo[key] = final
        return self._solo[key]

    # --- the scheduled run -----------------------------------------------------
    def build(self, setup: Setup) -> LLM:
        llm = LLM(model=str(self.target_dir), block_size=setup.block_size, num_blocks=setup.num_blocks,
                  max_model_len=setup.max_model_len, max_num_batched_tokens=setup.max_num_batched_tokens,
                  max_num_seqs=setup.max_num_seqs, enable_chunked_prefill=setup.enable_chunked_prefill,
                  enable_prefix_caching=setup.prefix_caching,
                  speculative=spec_dict(setup.spec_key, self.draft_dir, setup.disable_by_batch_size,
                                        self.eagle_dir))
        # the scheduled engine runs the fast decoder (llama, model.fast_forward = "auto"), target and
        # draft alike; the solo references it is compared with run it too, and HF's greedy checks them
        assert "target" in expect_fast_forward(llm)
        return llm

    def drive(self, llm: LLM, setup: Setup, reqs: list[Req]) -> Trace:
        eng = llm.engine
        trace = Trace()
        ids = [f"r{i}" for i in range(len(reqs))]
        k = setup.max_spec_tokens
        schedule = eng.scheduler.schedule

        def watched_schedule(*args, **kwargs):
            decoding = [r for r in eng.scheduler.running if r.is_decoding]
            batch = schedule(*args, **kwargs)
            check_step_shape(batch, decoding, setup, k, len(eng.scheduler.running))
            for d in batch.decodes:
                r = d.request
                alone = max(0, min(k, eng.max_model_len - r.num_tokens - 1,
                                   r.params.max_tokens - r.num_output_tokens - 1))
                if d.num_spec_tokens != alone:
                    trace.trimmed.add(r.request_id)
            for r in batch.preempted:
                trace.preempted.add(r.request_id)
                trace.preempted_at.setdefault(r.request_id, []).append(r.num_output_tokens)
            return batch

        eng.scheduler.schedule = watched_schedule
        last_event = max([r.arrive_at for r in reqs] + [r.abort_at or 0 for r in reqs])
        limit = 200 + 20 * sum(len(r.prompt) + r.params.max_tokens for r in reqs)
        step = 0
        while True:
            for rid, r in zip(ids, reqs):
                if r.arrive_at == step:
                    assert eng.add_request(rid, list(r.prompt), r.params) == rid
            for rid, r in zip(ids, reqs):
                if r.abort_at == step and step >= r.arrive_at:
                    done = rid in trace.finals
                    assert eng.abort_request(rid) is (not done), (
                        f"abort_request({rid}) returned the wrong answer (finished before: {done})")
                    if not done:
                        trace.aborted.add(rid)
            if step >= last_event and not eng.has_unfinished_requests():
                break
            for out in eng.step():
                rid = out.request_id
                assert rid not in trace.finals and rid not in trace.aborted, f"output for {rid} after it ended"
                tokens = list(out.outputs[0].token_ids)
                before = trace.streamed.get(rid, [])
                assert tokens[:len(before)] == before, f"{rid}: streamed tokens changed: {before} -> {tokens}"
                trace.streamed[rid] = tokens
                if out.finished:
                    trace.finals[rid] = Final.of(out)
                    check_logprobs(out, reqs[ids.index(rid)].params)
            for pool in pools(eng):
                pool.check()
            step += 1
            assert step <= limit, f"engine still busy after {limit} steps (livelock?)"
        trace.num_steps = step
        trace.prefix_hit_tokens = eng.get_metrics().get("prefix_cache_hit_tokens", 0)
        eng.scheduler.schedule = schedule
        return trace

    def check_idle(self, llm: LLM, reqs: list[Req], trace: Trace) -> None:
        eng = llm.engine
        ids = [f"r{i}" for i in range(len(reqs))]
        assert not eng.has_unfinished_requests()
        assert not eng.scheduler.running and not eng.scheduler.waiting
        for rid in ids:
            assert (rid in trace.finals) != (rid in trace.aborted), f"{rid} must end exactly once"
        for part in proposer_parts(eng.spec.proposer):
            state = getattr(part, "_state", None)  # eagle's head caches, suffix's request indexes
            assert not state, f"proposer {type(part).__name__} still holds state of {sorted(state or ())}"
        for name, pool in zip(("target", "draft"), pools(eng)):
            held = [rid for rid in ids if pool.has(rid)]
            assert not held, f"{name} pool still holds block tables of {held}"
            pool.check()
            assert pool.num_free_blocks == pool.num_blocks and pool.num_used_blocks == 0, (
                f"{name} pool: {pool.num_free_blocks} of {pool.num_blocks} blocks free after all requests ended")

    # --- comparisons -------------------------------------------------------------
    def _same_greedy(self, req: Req, ours: Final | list[int], ref: Final, what: str) -> None:
        """``ours`` (a Final, or a streamed prefix) against greedy ``ref``, near-tie aware."""
        a = ours.token_ids if isinstance(ours, Final) else ours
        b = ref.token_ids
        j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if j is None:
            if isinstance(ours, Final):
                assert (ours.token_ids, ours.text, ours.finish_reason, ours.stop_reason) == (
                    ref.token_ids, ref.text, ref.finish_reason, ref.stop_reason), (
                    f"{what}: differs from the request alone\n  ours:  {ours}\n  alone: {ref}")
            else:
                assert len(a) <= len(b), f"{what}: streamed {a} is not a prefix of the solo output {b}"
            return
        row = self.hf.logits_along(req.prompt, a[:j + 1])[j]
        gap = abs(float(row[a[j]]) - float(row[b[j]]))
        tol = NEAR_TIE_RTOL * max(1.0, float(row.abs().max()))
        assert gap <= tol, (
            f"{what}: first difference at output token {j} ({a[j]} vs {b[j]} alone); transformers' logits "
            f"differ by {gap:.3e} there, above the near-tie tolerance {tol:.3e}\n  ours:  {a}\n  alone: {b}")
        self.events.append("greedy near-tie tolerated")

    def _same_sampled(self, ours: Final | list[int], ref: Final, what: str) -> None:
        if isinstance(ours, Final):
            assert ours == ref, (
                f"{what}: seeded sample differs from the request alone\n  ours:  {ours}\n  alone: {ref}")
        else:
            assert ours == ref.token_ids[:len(ours)], (
                f"{what}: streamed {ours} is not a prefix of the solo output {ref.token_ids}")

    def compare(self, setup: Setup, req: Req, rid: str, trace: Trace) -> None:
        ours = trace.finals.get(rid)
        if ours is None:  # aborted: what it streamed must be a prefix of its solo output
            ours = trace.streamed.get(rid, [])
            if not ours:
                return
        else:
            p = req.params
            assert 1 <= len(ours.token_ids) <= p.max_tokens, f"{rid}: {len(ours.token_ids)} tokens"
            assert ours.finish_reason in ("stop", "length"), f"{rid}: finish_reason {ours.finish_reason}"
        mml = setup.max_model_len
        what = f"{rid} ({'greedy' if req.params.greedy else 'sampled'})"
        if req.params.greedy:
            if setup.spec_key is not None:
                self._same_greedy(req, ours, self.solo(req, setup.spec_key, mml), what + " vs alone, same spec")
            self._same_greedy(req, ours, self.solo(req, None, mml), what + " vs alone, no speculation")
            return
        if setup.spec_key is not None:
            if setup.draft_length == "adaptive" or (setup.proposer in SUFFIX_CACHED and setup.suffix_cache):
                # k (adaptive: it follows the batch) or the proposals (the cache holds other requests'
                # outputs) depend on the company a request keeps: another valid draw, not comparable
                self.events.append("sampled request not compared: proposals depend on other requests")
                return
            if rid in trace.trimmed:
                self.events.append("sampled request not compared: k trimmed in some step")
                return
            if rid in trace.preempted and not self.compare_preempted_spec_sampling:
                self.events.append("sampled request not compared: preempted while speculating (issue 13 item 4)")
                return
        alone = "same spec" if setup.spec_key is not None else "no speculation"
        self._same_sampled(ours, self.solo(req, setup.spec_key, mml), f"{what} vs alone, {alone}")

    # --- all of it ------------------------------------------------------------------
    def check(self, setup: Setup, reqs: list[Req]) -> Trace:
        self.events = []
        llm = self.build(setup)
        trace = self.drive(llm, setup, reqs)
        self.check_idle(llm, reqs, trace)
        for i, req in enumerate(reqs):
            self.compare(setup, req, f"r{i}", trace)
        return trace
