"""Greedy speculation is exact: every supported proposer × scorer × chunked
prefill on/off × chunk size × batch mix emits the same tokens as the engine
without speculation and as transformers ``generate()`` (near-tie aware).

Cost control: one short run (4 prompts, <= 16 tokens) per cell on the tiny
llama; the cells that would be redundant are left out (with k trimmed to 0 by
a 1-token budget, every proposer is skipped except the stateful draft model,
whose own KV cache still has to follow the 1-token prefill chunks).

Every cell also checks the step shape with a probe: no step spends more than
``max_num_batched_tokens`` (a decode speculating k costs 1 + k), no decode
speculates more than k, and each step runs the target exactly once, so a step
mixing prefill chunks and speculating decodes is one forward.
"""

from __future__ import annotations

import pytest

from greedy_compare import check_all_greedy
from spec_helpers import StepProbe, check_against, run, token_ids
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

K = 3
BLOCK = 4
# prompt lengths 3, 9, 17, plus a 14-token prompt chosen (see ``prompts``) so that
# the n-gram proposer has matches; per-prompt max_tokens differ so requests finish
# at different times and later prompts prefill while earlier ones decode
FIXED_PROMPTS = random_prompts([3, 9, 17], seed=11)
NGRAM_PROMPT_LEN = 14
MAX_TOKENS = [14, 8, 12, 10]
LONGEST = 17

# scheduler settings -> (LLM kwargs, whether a step must mix a prefill chunk with a speculating decode)
SCHEDULES = {
    # chunking off; the budget fits the longest prompt next to one speculating decode
    "nochunk": (dict(enable_chunked_prefill=False, max_num_batched_tokens=LONGEST + 1 + K, max_num_seqs=2), True),
    # 1-token chunks; a decode's 1 + k does not fit, so k is trimmed to 0
    "chunk1": (dict(max_num_batched_tokens=1, max_num_seqs=1), False),
    # a decode speculating k (1 + k tokens) next to a 1-token prefill chunk
    "chunk1_mixed": (dict(max_num_batched_tokens=K + 2, max_num_seqs=2), True),
    # block_size - 1: k trimmed to 2 (1 + k <= 3), chunks of 3 or less
    "bs-1": (dict(max_num_batched_tokens=BLOCK - 1, max_num_seqs=3), False),
    # block_size + 1: one full decode (4) + a 1-token chunk, or a 5-token chunk
    "bs+1": (dict(max_num_batched_tokens=BLOCK + 1, max_num_seqs=4), True),
    # the whole prompt in one chunk; max_num_seqs=2 makes later prompts prefill next to decodes
    "whole": (dict(max_num_batched_tokens=256, max_num_seqs=2), True),
}
PROPOSERS = ["ngram", "suffix", "draft_noisy", "draft_self"]
# the draft-length policies; 'adaptive' with a steep cost model so that k really varies step to step
POLICIES = {"fixed": {"policy": "fixed"}, "adaptive": {"policy": "adaptive", "token_cost": 0.3}}


def _keep(sched: str, proposer: str, scorer: str) -> bool:
    if sched == "chunk1":  # k is trimmed to 0: only a stateful proposer has anything left to get wrong
        return proposer == "draft_noisy"
    return True


CELLS = [
    pytest.param(proposer, scorer, sched, id=f"{proposer}-{scorer}-{sched}")
    for sched in SCHEDULES
    for proposer in PROPOSERS
    for scorer in ("mqa", "batch_expansion")
    if _keep(sched, proposer, scorer)
]


def spec_config(proposer: str, scorer: str, llama_dir, noisy_dir, k: int = K, **extra) -> dict:
    if proposer == "ngram":
        spec = {"proposer": "ngram", "proposer_options": {"min_n": 1, "max_n": 3}}
    elif proposer == "suffix":  # drafts as much as it can: long drafts from short matches
        spec = {"proposer": "suffix", "proposer_options": {"max_spec_factor": 3.0, "min_token_prob": 0.0}}
    else:
        draft = llama_dir if proposer == "draft_self" else noisy_dir
        spec = {"proposer": "draft_model", "proposer_options": {"model": str(draft)}}
    return {**spec, "scorer": scorer, "acceptance": "rejection", "num_speculative_tokens": k, **extra}


def params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]


@pytest.fixture(scope="module")
def prompts(hf_reference) -> list[list[int]]:
    """The fixed prompts plus the first random prompt whose greedy continuation
    repeats an earlier token at least twice before its last token, so the
    n-gram proposer proposes (random tiny models rarely repeat themselves)."""
    ref = hf_reference("llama")
    for seed in range(1000, 1200):
        prompt = random_prompts([NGRAM_PROMPT_LEN], seed=seed)[0]
        out = ref.greedy(prompt, MAX_TOKENS[3]).tokens
        if sum(out[j] in prompt + out[:j] for j in range(len(out) - 1)) >= 2:
            return FIXED_PROMPTS + [prompt]
    pytest.fail("no prompt gives the n-gram proposer a match")


@pytest.fixture(scope="module")
def refs(hf_reference, prompts):
    ref = hf_reference("llama")
    return [ref.greedy(p, n) for p, n in zip(prompts, MAX_TOKENS)]


@pytest.fixture(scope="module")
def baseline(llama_dir, prompts):
    return run(LLM(model=str(llama_dir), block_size=BLOCK), prompts, params())


@pytest.mark.parametrize("proposer,scorer,sched", CELLS)
def test_greedy_equal_across_matrix(proposer, scorer, sched, llama_dir, spec_noisy_draft_dir, prompts, refs,
                                    baseline):
    kwargs, must_mix = SCHEDULES[sched]
    llm = LLM(model=str(llama_dir), block_size=BLOCK,
              speculative=spec_config(proposer, scorer, llama_dir, spec_noisy_draft_dir), **kwargs)
    probe = StepProbe(llm)
    outputs = run(llm, prompts, params())
    check_against(outputs, refs, baseline, f"{proposer}/{scorer}/{sched}")

    probe.check_invariants(K, kwargs.get("enable_chunked_prefill", True))
    if sched == "chunk1":
        assert probe.spec_steps == 0  # 1 + k never fits a 1-token budget
        assert all(sum(s["prefill"]) <= 1 for s in probe.steps)
        return
    assert probe.spec_steps > 0
    if must_mix:
        assert probe.mixed_steps > 0, "no step had a speculating decode next to a prefill chunk"
    if sched == "bs-1":
        assert max(max(s["k"], default=0) for s in probe.steps) == BLOCK - 2  # trimmed to the budget
    m = llm.get_metrics()
    assert m["num_draft_tokens"] > 0
    if proposer == "draft_self":
        assert m["acceptance_rate"] == 1.0
    elif proposer == "draft_noisy":
        assert 0.0 < m["acceptance_rate"] < 1.0


@pytest.mark.parametrize("arch,draft_arch,scorer", [
    ("qwen2", "qwen2", "mqa"), ("qwen2", "qwen2", "batch_expansion"),
    ("mistral", "mistral", "mqa"), ("mistral", "mistral", "batch_expansion"),  # GQA with one KV head
    ("llama", "mistral", "mqa")])  # a draft of another architecture sharing the tokenizer
def test_greedy_equal_other_architectures(arch, draft_arch, scorer, model_dirs, hf_reference):
    target, draft = model_dirs[arch], model_dirs[draft_arch]
    llm = LLM(model=str(target), block_size=BLOCK, max_num_batched_tokens=BLOCK + 1, max_num_seqs=3,
              speculative=spec_config("draft_self", scorer, draft, None))
    probe = StepProbe(llm)
    outs = run(llm, FIXED_PROMPTS, params()[:3])
    ref = hf_reference(arch)
    check_all_greedy(token_ids(outs), [ref.greedy(p, n) for p, n in zip(FIXED_PROMPTS, MAX_TOKENS)],
                     f"{arch}/{draft_arch}/{scorer}")
    probe.check_invariants(K)
    assert probe.mixed_steps > 0
    if arch == draft_arch:
        assert llm.get_metrics()["acceptance_rate"] == 1.0


@pytest.mark.parametrize("proposer,scorer,sched", [
    pytest.param(p, sc, sched, id=f"{p}-{sc}-{sched}")
    for p, sc, sched in [("ngram", "mqa", "bs+1"), ("suffix", "batch_expansion", "whole"), ("suffix", "mqa", "bs+1"),
                         ("draft_noisy", "mqa", "chunk1_mixed"), ("draft_noisy", "batch_expansion", "nochunk"),
                         ("draft_self", "mqa", "whole")]])
def test_greedy_equal_under_adaptive_draft_length(proposer, scorer, sched, llama_dir, spec_noisy_draft_dir, prompts,
                                                  refs, baseline):
    """The adaptive policy changes k step by step and request by request; the
    tokens stay those of no speculation."""
    kwargs, _ = SCHEDULES[sched]
    llm = LLM(model=str(llama_dir), block_size=BLOCK, **kwargs,
              speculative=spec_config(proposer, scorer, llama_dir, spec_noisy_draft_dir,
                                      draft_length=POLICIES["adaptive"]))
    probe = StepProbe(llm)
    outputs = run(llm, prompts, params())
    check_against(outputs, refs, baseline, f"{proposer}/{scorer}/{sched}/adaptive")
    probe.check_invariants(K, kwargs.get("enable_chunked_prefill", True))
    m = llm.get_metrics()
    assert m["draft_length_policy"] == "adaptive" and m["num_draft_tokens"] > 0
    ks = {k for s in probe.steps for k in s["k"]}
    if proposer == "draft_self":  # always accepted: the policy keeps k at its maximum
        assert m["acceptance_rate"] == 1.0 and K in ks
    else:  # rejections lower k below its maximum for some steps
        assert len(ks) > 1, ks
