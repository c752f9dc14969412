"""Prefix caching changes no output.

Prompts share prefixes that end at a block boundary, inside a block, cover a
whole earlier prompt (the same prompt again, a longer one) or carry an earlier
request's output (a chat's next turn). They run one after another (hits on
finished requests' blocks) and all at once under a small budget (hits on
running requests' committed blocks, admissions next to speculating decodes).
For no speculation and every proposer × scorer, greedy output equals the
same engine with caching off token for token (float32) and transformers'
``generate()`` (near-tie aware), the cache is really hit (metrics), each hit
request's first chunk starts after its cached blocks, and the target's and the
draft's pools keep their accounting (empty + cached + in use = total, reference
counts equal the block tables) after every step and are idle at the end. A
draft model hits its own pool as often as the target, and no proposer's
drafts change with caching: drafted and accepted counts equal the uncached
run's wherever the steps are the same (one by one, and each chat turn, whose
blocks hold generated tokens).
"""

from __future__ import annotations

import pytest
import torch

from greedy_compare import check_all_greedy
from spec_helpers import check_against, token_ids
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

BLOCK = 4
K = 3
BASE = random_prompts([30], seed=31)[0]
TAILS = random_prompts([9, 9, 9], seed=32)
PROMPTS = [
    BASE[:22],  # nothing cached yet
    BASE[:22],  # the same prompt: 5 of its 6 blocks (its last token is always computed)
    BASE[:16] + TAILS[0][:7],  # shares exactly 4 blocks: a block boundary
    BASE[:14] + TAILS[1][:9],  # shares 3 blocks and 2 tokens inside the 4th
    BASE[:8],  # exactly 2 blocks: 1 cached, the block holding the last token computed
    BASE[:30],  # extends the first prompt
]
MAX_TOKENS = [10, 9, 12, 8, 11, 10]
PROPOSERS = ["ngram", "suffix", "draft_noisy", "draft_self", "medusa", "mlp_speculator", "eagle", "eagle_suffix",
             "draft_suffix"]


def spec(proposer: str | None, scorer: str, llama_dir, noisy_dir, heads) -> dict:
    if proposer is None:
        return {}
    if proposer in ("ngram", "suffix"):
        options: dict = {}
    elif proposer == "draft_noisy":
        proposer, options = "draft_model", {"model": str(noisy_dir)}
    elif proposer == "draft_self":
        proposer, options = "draft_model", {"model": str(llama_dir)}
    elif proposer == "eagle_suffix":
        options = {"eagle": {"path": str(heads["eagle"])}, "min_match_len": 1}
    elif proposer == "draft_suffix":
        options = {"draft": {"model": str(noisy_dir)}, "min_match_len": 1}
    else:
        options = {"path": str(heads[proposer])}
    return {"proposer": proposer, "proposer_options": options, "scorer": scorer, "num_speculative_tokens": K}


def params(max_tokens=MAX_TOKENS) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]


def pools(llm: LLM) -> list:
    eng = llm.engine
    found = [eng.blocks]
    prop = eng.spec.proposer
    for part in getattr(prop, "parts", [prop]) if prop is not None else []:
        if hasattr(part, "runner"):
            found.append(part.runner._blocks)
    return found


class Watch:
    """Checks every pool after every step and records each request's first
    chunk start and the cached tokens each proposer pool (a draft model's)
    gave each request."""

    def __init__(self, llm: LLM) -> None:
        self.first_start: dict[str, int] = {}
        self.draft_hits: dict[str, int] = {}
        eng = llm.engine
        step, self.pools = eng.step, pools(llm)
        for pool in self.pools[1:]:
            allocate = pool.allocate

            def watched_allocate(seq_id, num_tokens, prefix=(), pool=pool, allocate=allocate):
                if prefix and not pool.has(seq_id):
                    rid = seq_id.split(":", 2)[2]  # the draft runner's id for a sequence it labelled rid
                    self.draft_hits[rid] = self.draft_hits.get(rid, 0) + len(prefix) * pool.block_size
                return allocate(seq_id, num_tokens, prefix)

            pool.allocate = watched_allocate

        def watched():
            outs = step()
            for pool in self.pools:
                pool.check()
            return outs

        schedule = eng.scheduler.schedule

        def watched_schedule(*args, **kwargs):
            batch = schedule(*args, **kwargs)
            for p in batch.prefills:
                self.first_start.setdefault(p.request.request_id, p.start)
            return batch

        eng.step, eng.scheduler.schedule = watched, watched_schedule


def run(llm: LLM, prompts, sps, together: bool) -> list:
    eng = llm.engine
    outs: dict[str, object] = {}
    ids = []
    for i, (p, sp) in enumerate(zip(prompts, sps)):
        ids.append(eng.add_request(f"r{i}", list(p), sp))
        if together and i < len(prompts) - 1:
            continue
        steps = 0
        while eng.has_unfinished_requests():
            steps += 1
            assert steps < 2000
            for o in eng.step():
                if o.finished:
                    outs[o.request_id] = o
    return [outs[i] for i in ids]


def make(llama_dir, proposer, scorer, noisy, heads, caching: bool, together: bool) -> LLM:
    sched = dict(max_num_batched_tokens=7, max_num_seqs=3) if together else dict(max_num_batched_tokens=64)
    return LLM(model=str(llama_dir), block_size=BLOCK, enable_prefix_caching=caching,
               speculative=spec(proposer, scorer, llama_dir, noisy, heads), **sched)


@pytest.fixture(scope="module")
def refs(hf_reference):
    ref = hf_reference("llama")
    return [ref.greedy(p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]


@pytest.fixture(scope="module")
def uncached(llama_dir):
    """The engine without speculation and without caching, per mode."""
    return {together: run(make(llama_dir, None, "mqa", None, None, False, together), PROMPTS, params(), together)
            for together in (False, True)}


def check_hits(llm: LLM, watch: Watch, together: bool, proposer: str | None) -> None:
    m = llm.get_metrics()
    assert m["prefix_caching"] is True
    assert m["prefix_cache_hit_tokens"] > 0 and m["prefix_cache_hit_blocks"] > 0, m
    assert m["prefix_cache_hit_tokens"] == BLOCK * m["prefix_cache_hit_blocks"]
    assert 0 < m["prefix_cache_hit_rate"] < 1 and 0 < m["prefix_cache_block_hit_rate"] <= 1
    if not together:  # one at a time: every later prompt finds what an earlier one left
        starts = [watch.first_start[f"r{i}"] for i in range(len(PROMPTS))]
        assert starts[0] == 0
        assert starts[1:] == [20, 16, 12, 4, 20], starts  # proposers follow the target's hits (EAGLE: restored)
        assert m["prefix_cache_hit_tokens"] == sum(starts)
    if len(watch.pools) > 1:  # a draft model's pool: it reuses its own cached blocks too
        assert sum(watch.draft_hits.values()) > 0, "the draft model's pool was never hit"
        if not together:  # ... as many as the target's for each request
            assert [watch.draft_hits.get(f"r{i}", 0) for i in range(len(PROMPTS))] == [0] + starts[1:], \
                (watch.draft_hits, starts)
    for pool in watch.pools:
        pool.check()
        assert pool.num_used_blocks == 0 and pool.num_free_blocks == pool.num_blocks


@pytest.mark.parametrize("together", [False, True], ids=["one_by_one", "together"])
def test_no_speculation(together, llama_dir, refs, uncached):
    llm = make(llama_dir, None, "mqa", None, None, True, together)
    watch = Watch(llm)
    outs = run(llm, PROMPTS, params(), together)
    check_against(outs, refs, uncached[together], f"prefix caching, no speculation, together={together}")
    assert token_ids(outs) == token_ids(uncached[together]), "float32: token for token"
    check_hits(llm, watch, together, None)


@pytest.mark.parametrize("together", [False, True], ids=["one_by_one", "together"])
@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_every_proposer_and_scorer(proposer, scorer, together, llama_dir, spec_noisy_draft_dir, random_heads_dirs,
                                   refs, uncached):
    if together and scorer == "batch_expansion" and proposer not in ("draft_noisy", "eagle"):
        pytest.skip("the stateless proposers' batch-expansion cells add nothing to the mqa ones")
    args = (llama_dir, proposer, scorer, spec_noisy_draft_dir, random_heads_dirs)
    llm = make(*args, True, together)
    watch = Watch(llm)
    outs = run(llm, PROMPTS, params(), together)
    what = f"prefix caching, {proposer}/{scorer}, together={together}"
    check_against(outs, refs, uncached[together], what)
    plain_llm = make(*args, False, together)
    plain = run(plain_llm, PROMPTS, params(), together)
    assert token_ids(outs) == token_ids(plain), f"{what}: differs from the same engine without caching"
    check_hits(llm, watch, together, proposer)
    m, p = llm.get_metrics(), plain_llm.get_metrics()
    assert m["num_draft_tokens"] > 0
    if not together:  # the same steps with and without caching, and the proposers' state restored: same drafts
        assert (m["num_draft_tokens"], m["num_accepted_tokens"]) == (p["num_draft_tokens"], p["num_accepted_tokens"])


@pytest.mark.parametrize("proposer", [None, "ngram", "draft_noisy", "eagle"])
def test_chat_turns_hit_the_previous_turn_including_its_output(proposer, llama_dir, spec_noisy_draft_dir,
                                                               random_heads_dirs, hf_reference):
    """Each turn resends the previous turn's prompt and output plus a new
    message: the blocks holding generated tokens (written by verify steps,
    rejected proposals overwritten) are hit too, and output is unchanged."""
    args = (llama_dir, proposer, "mqa", spec_noisy_draft_dir, random_heads_dirs)
    cached, plain = make(*args, True, False), make(*args, False, False)
    watch = Watch(cached)
    ref = hf_reference("llama")
    history = list(BASE[:10])
    for turn, msg in enumerate(random_prompts([5, 6, 7, 5, 6], seed=77)):  # five turns: more offsets at the end
        history += msg
        sp = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
        a, b = run(cached, [history], [sp], False)[0], run(plain, [history], [sp], False)[0]
        check_all_greedy(token_ids([a]), [ref.greedy(history, 9)], f"chat turn {turn} ({proposer})")
        assert a.outputs[0].token_ids == b.outputs[0].token_ids, f"turn {turn}: caching changed the output"
        if turn:  # the previous turn keyed every full block below its last (never computed) token
            start, keyed = watch.first_start["r0"], BLOCK * ((len(history) - len(msg) - 1) // BLOCK)
            if proposer == "eagle":  # the head had not caught up with the last step's tokens: a block less at most
                assert keyed - BLOCK <= start <= keyed, (turn, start, keyed)
            else:
                assert start == keyed, (turn, start, keyed)
            if len(watch.pools) > 1:  # the draft reuses its own blocks: those it computed (at most 2 tokens short)
                hit = watch.draft_hits.get("r0", 0)
                assert 0 < hit and start - BLOCK <= hit <= start, (turn, watch.draft_hits, start)
        if proposer is not None:  # the same steps, and no proposer state (a draft's cached K/V) differs: same drafts
            m, p = cached.get_metrics(), plain.get_metrics()
            assert (m["num_draft_tokens"], m["num_accepted_tokens"]) == \
                (p["num_draft_tokens"], p["num_accepted_tokens"]), f"turn {turn}: caching changed the drafts"
        history += a.outputs[0].token_ids
        watch.first_start.clear()
        watch.draft_hits.clear()
    m = cached.get_metrics()
    assert m["prefix_cache_hit_tokens"] > 0
    assert (m["num_draft_tokens"] > 0) == (proposer is not None)


@pytest.mark.parametrize("proposer", ["eagle", "eagle_suffix"])
def test_eagle_head_cache_restored_equals_recomputed(proposer, llama_dir, spec_noisy_draft_dir, random_heads_dirs):
    """The head's cache of a request admitted after a cached prefix (rebuilt
    from the prefix store, the block boundary's last entry recomputed from the
    kept hidden state) equals the cache the head builds from the whole prompt."""
    args = (llama_dir, proposer, "mqa", spec_noisy_draft_dir, random_heads_dirs)
    caches, seqs = [], []
    for caching in (True, False):
        llm = make(*args, caching, False)
        prop = llm.engine.spec.proposer
        head = getattr(prop, "model", prop)
        seen: dict[str, tuple] = {}
        free = head.free

        def snapshot(rid, head=head, seen=seen, free=free):
            st = head._state.get(rid)
            if st is not None:
                seen[rid] = (st.base, st.true_len, st.kv.k[:st.true_len].clone(), st.kv.v[:st.true_len].clone())
            free(rid)

        head.free = snapshot
        outs = run(llm, PROMPTS, params(), False)
        caches.append(seen)
        seqs.append({f"r{i}": list(p) + o.outputs[0].token_ids for i, (p, o) in enumerate(zip(PROMPTS, outs))})
        if caching:
            assert llm.get_metrics()["prefix_cache_hit_tokens"] == 72
            assert len(head.prefix_store) > 0
    (cached, plain), (tokens, _) = caches, seqs
    assert set(cached) == set(plain) == {f"r{i}" for i in range(len(PROMPTS))}

    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    for rid in plain:
        (b1, n1, k1, v1), (b2, n2, k2, v2) = cached[rid], plain[rid]
        assert b1 == b2 == 0, rid
        if proposer == "eagle":
            assert n1 == n2 > 0, rid
        # the hybrid's head catches up only when it drafts: the restored cache may be ahead of the recomputed one,
        # which may be empty (the same prompt again, all drafted by the suffix tree): then compare with the
        # recomputed cache of the request sharing the longest token prefix (entry i depends on tokens <= i + 1)
        ref = rid if n2 else max(plain, key=lambda r: min(plain[r][1], common(tokens[rid], tokens[r]) - 1))
        (_, n2, k2, v2) = plain[ref]
        n = min(n1, n2, common(tokens[rid], tokens[ref]) - 1)
        assert n > 0, (rid, ref, n1, n2)  # never an empty comparison
        torch.testing.assert_close(k1[:n], k2[:n], rtol=1e-5, atol=1e-5, msg=rid)
        torch.testing.assert_close(v1[:n], v2[:n], rtol=1e-5, atol=1e-5, msg=rid)
