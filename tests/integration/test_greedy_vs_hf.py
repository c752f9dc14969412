"""Greedy output of the engine equals transformers' ``generate(do_sample=False)``
token for token (up to fp32 near-ties, see ``greedy_compare``), for tiny random
Llama, Qwen2 and Mistral (GQA, one KV head) models, across chunk sizes, block
sizes, chunking on/off, many concurrent requests and KV-pool preemption.

Every run batches prompts of different lengths in one ``LLM.generate`` call;
prompt lengths straddle the block sizes used (1, 3, 4, 5, 15, 16, 17, 33, 50).
"""

from __future__ import annotations

import pytest

from greedy_compare import check_all_greedy
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = ("llama", "qwen2", "mistral")
MAX_TOKENS = 20
PROMPT_LENGTHS = [1, 3, 4, 5, 15, 16, 17, 33, 50]
TEXT_PROMPT = "def parse(self, text):\n    return"

# name -> engine overrides. max_num_batched_tokens is the prefill chunk size; it
# must be >= max_num_seqs (every running request needs a token per step).
CHUNK_CONFIGS = {
    "bs16-chunk1": dict(block_size=16, max_num_batched_tokens=1, max_num_seqs=1),
    "bs16-chunk15": dict(block_size=16, max_num_batched_tokens=15, max_num_seqs=4),
    "bs16-chunk16": dict(block_size=16, max_num_batched_tokens=16, max_num_seqs=4),
    "bs16-chunk17": dict(block_size=16, max_num_batched_tokens=17, max_num_seqs=4),
    "bs16-whole-prompt": dict(block_size=16, max_num_batched_tokens=256, max_num_seqs=16),
    "bs4-chunk1": dict(block_size=4, max_num_batched_tokens=1, max_num_seqs=1),
    "bs4-chunk3": dict(block_size=4, max_num_batched_tokens=3, max_num_seqs=3),
    "bs4-chunk4": dict(block_size=4, max_num_batched_tokens=4, max_num_seqs=4),
    "bs4-chunk5": dict(block_size=4, max_num_batched_tokens=5, max_num_seqs=5),
    "bs16-chunking-off": dict(block_size=16, max_num_batched_tokens=64, max_num_seqs=8,
                              enable_chunked_prefill=False),
    "bs4-chunking-off": dict(block_size=4, max_num_batched_tokens=64, max_num_seqs=8,
                             enable_chunked_prefill=False),
}

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _prompt_ids(llm: LLM, prompts: list) -> list[list[int]]:
    return [p if isinstance(p, list) else llm.tokenizer(p, add_special_tokens=False)["input_ids"]
            for p in prompts]


def _run_and_check(arch, model_dirs, hf_reference, prompts, params, what, running=None, **overrides):
    """Generate with the engine, compare every output with HF greedy; if
    ``running`` is a list, append the number of running requests at each step."""
    llm = LLM(str(model_dirs[arch]), **overrides)
    if running is not None:
        engine, step = llm.engine, llm.engine.step

        def observed_step():
            outs = step()
            running.append(len(engine.scheduler.running))
            return outs

        engine.step = observed_step
    outs = llm.generate(prompts, params, use_tqdm=False)
    params = params if isinstance(params, list) else [params] * len(prompts)
    ref = hf_reference(arch)
    refs = [ref.greedy(ids, p.max_tokens, stop_at_eos=not p.ignore_eos)
            for ids, p in zip(_prompt_ids(llm, prompts), params)]
    check_all_greedy([o.outputs[0].token_ids for o in outs], refs, what)
    return outs


@pytest.mark.parametrize("config", list(CHUNK_CONFIGS))
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_across_chunk_sizes(arch, config, model_dirs, hf_reference):
    prompts = random_prompts(PROMPT_LENGTHS, seed=1) + [TEXT_PROMPT]
    outs = _run_and_check(arch, model_dirs, hf_reference, prompts, GREEDY, f"{arch}/{config}",
                          **CHUNK_CONFIGS[config])
    for out in outs:
        assert out.finished and out.outputs[0].finish_reason == "length"
        assert len(out.outputs[0].token_ids) == MAX_TOKENS


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_with_many_concurrent_requests(arch, model_dirs, hf_reference):
    lengths = [2, 7, 11, 19, 23, 29, 31, 40, 45, 52, 58, 64]
    prompts = random_prompts(lengths, seed=2)
    params = [SamplingParams(temperature=0.0, max_tokens=8 + (i * 5) % 17, ignore_eos=True)
              for i in range(len(prompts))]
    running: list[int] = []
    outs = _run_and_check(arch, model_dirs, hf_reference, prompts, params, f"{arch}/concurrent", running,
                          block_size=8, max_num_batched_tokens=32, max_num_seqs=12)
    assert max(running) >= 10, f"expected many requests in flight at once, saw at most {max(running)}"
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "chunking-off"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_under_preemption(arch, chunked, model_dirs, hf_reference):
    """A 24-block pool (96 token slots; max_model_len 64 so one full sequence
    fits) serving 8 requests that need up to 59 slots each forces preemption by
    recompute; outputs must not change. With
    chunking off, a recomputed prompt + output (up to 59 tokens) exceeds the
    40-token budget and must run alone."""
    prompts = random_prompts([9, 14, 21, 26, 30, 35, 12, 18], seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    budget = dict(max_num_batched_tokens=16, enable_chunked_prefill=True) if chunked else \
        dict(max_num_batched_tokens=40, enable_chunked_prefill=False)
    outs = _run_and_check(arch, model_dirs, hf_reference, prompts, params, f"{arch}/preemption",
                          block_size=4, num_blocks=24, max_model_len=64, max_num_seqs=8, **budget)
    preemptions = [o.metrics["num_preemptions"] for o in outs]
    assert sum(preemptions) > 0, f"the pool was meant to force preemption; got {preemptions}"
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)


def test_eos_stops_like_hf(eos_case, hf_reference):
    """Without ignore_eos, EOS ends generation at the same token as HF's
    ``generate()`` (EOS included in token_ids, finish_reason 'stop'); prompts
    that never reach EOS run to max_tokens on both sides."""
    prompts = [eos_case.prompt] + random_prompts([5, 17, 30], seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    llm = LLM(str(eos_case.model_dir), block_size=4, max_num_batched_tokens=8, max_num_seqs=4)
    outs = llm.generate(prompts, params, use_tqdm=False)
    ref = hf_reference(eos_case.model_dir)
    refs = [ref.greedy(p, MAX_TOKENS, stop_at_eos=True) for p in prompts]
    check_all_greedy([o.outputs[0].token_ids for o in outs], refs, "eos")
    first = outs[0].outputs[0]
    assert first.token_ids == eos_case.tokens[: eos_case.eos_index + 1]
    assert first.token_ids[-1] == eos_case.eos_token_id
    assert first.finish_reason == "stop" and first.stop_reason is None
    for out in outs[1:]:
        o = out.outputs[0]
        if o.token_ids[-1] == eos_case.eos_token_id:
            assert o.finish_reason == "stop"
        else:
            assert o.finish_reason == "length" and len(o.token_ids) == MAX_TOKENS


# --- the comparison helper itself -------------------------------------------

def _fake_reference(tokens, top_logit, runner_up_logit):
    """HF picked ``tokens``; at output 1 the runner-up token 7 scores ``runner_up_logit``."""
    import torch

    from greedy_compare import HFGreedy

    logits = torch.zeros(len(tokens), 10)
    for j, t in enumerate(tokens):
        logits[j, t] = top_logit
    logits[1, 7] = runner_up_logit
    return HFGreedy(tokens, logits)


def test_compare_tolerates_a_near_tie_and_stops_there():
    from greedy_compare import check_greedy

    ref = _fake_reference([1, 2, 3, 4], top_logit=10.0, runner_up_logit=10.0 - 5e-4)
    match = check_greedy([1, 7, 9, 9], ref)  # diverges at a near-tie, then anything goes
    assert match.near_tie_at == 1 and match.num_compared == 1


def test_compare_fails_on_a_real_gap():
    from greedy_compare import check_greedy

    ref = _fake_reference([1, 2, 3, 4], top_logit=10.0, runner_up_logit=9.9)
    with pytest.raises(AssertionError, match="real divergence"):
        check_greedy([1, 7, 3, 4], ref)
    with pytest.raises(AssertionError, match="engine produced 3 and HF 4"):
        check_greedy([1, 2, 3], ref)
