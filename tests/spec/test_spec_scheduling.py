"""How speculation spends the step's token budget.

Draft tokens count against ``max_num_batched_tokens`` (a decode speculating k
costs 1 + k) and k is trimmed per request to what is left (0..k). Trimming k
is how speculation fits the budget: it must never cost a running decode its
step, since without speculation every running request advances each step
(config validation requires max_num_batched_tokens >= max_num_seqs for
exactly that: "every running request needs at least one token per step").
"""

from __future__ import annotations

from spec_helpers import StepProbe, run
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

K = 3
PROMPTS = random_prompts([2, 2, 2, 2], seed=41)


def test_without_speculation_every_decode_runs_each_step(llama_dir):
    llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=8, max_num_seqs=4)
    probe = StepProbe(llm)
    run(llm, PROMPTS, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert all(len(s["k"]) == s["decoding"] for s in probe.steps)


def test_speculation_never_starves_a_running_decode(llama_dir):
    llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=8, max_num_seqs=4,
              speculative={"proposer": "draft_model", "proposer_options": {"model": str(llama_dir)},
                           "num_speculative_tokens": K})
    probe = StepProbe(llm)
    run(llm, PROMPTS, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    probe.check_invariants(K)
    starved = [s for s in probe.steps if len(s["k"]) < s["decoding"]]
    assert not starved, f"{len(starved)} steps left running decodes out, e.g. {starved[0]}"
