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
from spec_helpers import StepProbe, check_against, run

from speculant import LLM, SamplingParams
from tiny_models import random_prompts

K = 3
BLOCK = 4
# prompt lengths 3, 9, 22 and a repetitive 20-token prompt that gives the n-gram
# proposer matches; per-prompt max_tokens differ so requests finish at different
# times and later prompts prefill while earlier ones decode
_base = random_prompts([6], seed=3)[0]
PROMPTS = random_prompts([3, 9, 22], seed=11) + [_base * 3 + _base[:2]]
MAX_TOKENS = [16, 9, 14, 12]
LONGEST = max(len(p) for p in PROMPTS)

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
PROPOSERS = ["ngram", "draft_noisy", "draft_self"]
CELLS = [
    pytest.param(proposer, scorer, sched, id=f"{proposer}-{scorer}-{sched}")
    for sched in SCHEDULES
    for proposer in PROPOSERS
    for scorer in ("mqa", "batch_expansion")
    if sched != "chunk1" or proposer == "draft_noisy"
]


def spec_config(proposer: str, scorer: str, llama_dir, noisy_dir, k: int = K, **extra) -> dict:
    if proposer == "ngram":
        spec = {"proposer": "ngram", "proposer_options": {"min_n": 1, "max_n": 3}}
    else:
        draft = llama_dir if proposer == "draft_self" else noisy_dir
        spec = {"proposer": "draft_model", "proposer_options": {"model": str(draft)}}
    return {**spec, "scorer": scorer, "acceptance": "rejection", "num_speculative_tokens": k, **extra}


def params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]


@pytest.fixture(scope="module")
def refs(hf_reference):
    ref = hf_reference("llama")
    return [ref.greedy(p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]


@pytest.fixture(scope="module")
def baseline(llama_dir):
    return run(LLM(model=str(llama_dir), block_size=BLOCK), PROMPTS, params())


@pytest.mark.parametrize("proposer,scorer,sched", CELLS)
def test_greedy_equal_across_matrix(proposer, scorer, sched, llama_dir, spec_noisy_draft_dir, refs, baseline):
    kwargs, must_mix = SCHEDULES[sched]
    llm = LLM(model=str(llama_dir), block_size=BLOCK,
              speculative=spec_config(proposer, scorer, llama_dir, spec_noisy_draft_dir), **kwargs)
    probe = StepProbe(llm)
    outputs = run(llm, PROMPTS, params())
    check_against(outputs, refs, baseline, f"{proposer}/{scorer}/{sched}")

    probe.check_invariants(K)
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
    if proposer != "ngram":
        assert m["num_draft_tokens"] > 0
    if proposer == "draft_self":
        assert m["acceptance_rate"] == 1.0
    elif proposer == "draft_noisy":
        assert 0.0 < m["acceptance_rate"] < 1.0
