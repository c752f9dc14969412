"""The suffix proposer end to end: its global cache of finished outputs makes a
repeated task cheaper (acceptance rises on the second identical request, and
only because of the cache), the output stays that of no speculation, and no
per-request state outlives its request (finish, abort, preemption)."""

from __future__ import annotations

from spec_helpers import run
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

PROMPTS = random_prompts([12, 20], seed=33)
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)



def untimed(metrics: dict) -> dict:
    """The metrics without the clock readings (``propose_s``): the counts must repeat, times never do."""
    return {k: v for k, v in metrics.items() if not k.endswith("_s")}

def suffix_llm(llama_dir, **options) -> LLM:
    return LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=64,
               speculative={"proposer": "suffix", "num_speculative_tokens": 8,
                            "proposer_options": {"max_spec_factor": 2.0, **options}})


def test_second_identical_request_drafts_from_the_cache(llama_dir):
    baseline = run(LLM(model=str(llama_dir), block_size=4), PROMPTS, GREEDY)
    llm = suffix_llm(llama_dir)
    first = run(llm, PROMPTS, GREEDY)
    second = run(llm, PROMPTS, GREEDY)
    for a, b, ref in zip(first, second, baseline):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids == ref.outputs[0].token_ids
        m1, m2 = a.metrics, b.metrics
        # the whole output is in the cache: nearly every proposal is accepted, in few long steps
        assert m2["acceptance_rate"] > max(m1["acceptance_rate"], 0.9), (m1, m2)
        assert m2["mean_accepted_length"] > m1["mean_accepted_length"] + 2, (m1, m2)
        assert m2["num_steps"] < m1["num_steps"] or m1["num_steps"] == 0, (m1, m2)
    assert len(llm.engine.spec.proposer.cache.sequences) == 2 * len(PROMPTS)

    # without the cache the repeat gains nothing: its stats equal the first run's
    no_cache = suffix_llm(llama_dir, max_cached_requests=0)
    once, again = run(no_cache, PROMPTS, GREEDY), run(no_cache, PROMPTS, GREEDY)
    assert [untimed(o.metrics) for o in once] == [untimed(o.metrics) for o in again]
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in baseline]


def test_state_released_after_finish_abort_and_preemption(llama_dir):
    # a pool of 16 blocks of 4: two 20+32-token requests cannot both fit, so one is preempted
    llm = LLM(model=str(llama_dir), block_size=4, num_blocks=16, max_model_len=56, max_num_batched_tokens=64,
              speculative={"proposer": "suffix", "num_speculative_tokens": 4,
                           "draft_length": {"policy": "adaptive"}})
    eng = llm.engine
    prompts = random_prompts([20, 21, 9], seed=5)
    ids = [eng.add_request(None, p, GREEDY) for p in prompts]
    preempted = 0
    for step in range(400):
        if step == 3:
            assert eng.abort_request(ids[2])
        preempted += sum(1 for r in eng.scheduler.running if r.num_preemptions)
        eng.step()
        if not eng.has_unfinished_requests():
            break
    assert preempted > 0, "the pool was meant to force a preemption"
    proposer = eng.spec.proposer
    assert not proposer._state, sorted(proposer._state)
    assert not eng.draft_length._state, sorted(eng.draft_length._state)
    assert len(proposer.cache.sequences) == 2  # the aborted request's output is not cached


def test_seeded_sampling_alone_equals_preempted_in_company(llama_dir):
    """Without its cache the suffix proposer's drafts depend only on the
    request's own tokens, so seeded sampling is the same alone and preempted
    among others (with the cache, drafts depend on which requests finished
    first: another valid draw, as for the adaptive policy)."""
    prompts = random_prompts([9, 14, 21, 26, 30, 12], seed=23)
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=24, ignore_eos=True)
              for i in range(len(prompts))]
    spec = {"proposer": "suffix", "num_speculative_tokens": 3,
            "proposer_options": {"max_cached_requests": 0, "max_spec_factor": 3.0, "min_token_prob": 0.0}}
    roomy = LLM(model=str(llama_dir), block_size=4, max_model_len=64, speculative=spec)
    alone = [roomy.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids for p, sp in zip(prompts, params)]
    tight = LLM(model=str(llama_dir), block_size=4, max_model_len=64, num_blocks=16, speculative=spec)
    outs = tight.generate(prompts, params, use_tqdm=False)
    assert sum(o.metrics["num_preemptions"] for o in outs) >= 3, "the tiny pool was meant to preempt"
    assert tight.get_metrics()["num_draft_tokens"] > 0
    assert [o.outputs[0].token_ids for o in outs] == alone
