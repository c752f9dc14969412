"""bfloat16 on the fused CPU path is batch-invariant end to end: every row of a forward is
computed on its own (the AVX512-BF16 linears sum each row in one order whatever the row count,
the norms, rotary and silu work row by row, and the C attention kernel takes every span, prefill
chunks cut into pieces, each row over its own keys in fixed tiles). So greedy output with
speculation, under chunked prefill and a batch of requests landing in varying step layouts,
equals each request run alone without speculation, token for token, as in float32. Hypothesis
draws the requests; the engines are built once per architecture and proposer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_marks import needs_bf16_paths

from fast_paths import expect_fast_forward
from speculant import LLM, SamplingParams
from speculant.model.linear.dot_linear import dot_linear_unavailable_reason
from tiny_models import random_prompts

_WHY_NOT = dot_linear_unavailable_reason(torch.zeros(16, 16, dtype=torch.bfloat16))
pytestmark = [pytest.mark.usefixtures("one_thread"), needs_bf16_paths]  # only the fused path is row-invariant

ARCHS = ("llama", "qwen2", "mistral")
PROPOSERS = ("draft_model", "ngram", "suffix")
MAX_TOKENS = 24
ENGINE = dict(dtype="bfloat16", fast_forward="on", block_size=4, max_num_batched_tokens=20, max_num_seqs=6,
              max_model_len=160)


@pytest.fixture(scope="module")
def engines(zoo):
    """(arch, proposer or None) -> LLM; built on first use."""
    built: dict[tuple[str, str | None], LLM] = {}

    def get(arch: str, proposer: str | None) -> LLM:
        if (arch, proposer) not in built:
            spec: dict = {}
            if proposer == "draft_model":  # a noisy copy of the target: its drafts are often accepted
                spec = {"speculative": {"proposer": proposer, "num_speculative_tokens": 4,
                                        "proposer_options": {"model": str(zoo(arch, draft=True))}}}
            elif proposer is not None:  # on random tiny models these may find nothing to accept
                spec = {"speculative": {"proposer": proposer, "num_speculative_tokens": 5}}
            llm = built[(arch, proposer)] = LLM(str(zoo(arch)), **ENGINE, **spec)
            assert expect_fast_forward(llm) == (["target", "draft"] if proposer == "draft_model" else ["target"])
        return built[(arch, proposer)]
    return get


def requests(draw_lengths: list[int], repeats: list[int], seed: int) -> list[list[int]]:
    """Random prompts and a short pattern repeated (the tiny models go on repeating a pattern they
    were shown often enough, so the proposers' drafts are accepted); the last one repeats it 10 times."""
    plain = random_prompts(draw_lengths, seed=seed)
    pattern = random_prompts([5], seed=seed + 1)[0]
    return plain + [pattern * r for r in repeats] + [pattern * 10]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arch=st.sampled_from(ARCHS), proposer=st.sampled_from(PROPOSERS),
       lengths=st.lists(st.integers(1, 60), min_size=1, max_size=5),
       repeats=st.lists(st.integers(2, 8), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_speculative_batches_equal_solo_runs_without_speculation(engines, arch, proposer, lengths, repeats, seed):
    prompts = requests(lengths, repeats, seed)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    plain = engines(arch, None)
    solo = [plain.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    spec = engines(arch, proposer)
    spec.engine.reset_metrics()
    batched = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    assert batched == solo
    metrics = spec.get_metrics()
    assert metrics["num_draft_tokens"] > 0, "nothing was verified: the test proved little"
    if proposer == "draft_model":
        assert metrics["num_accepted_tokens"] > 0, "no draft was accepted: the test proved little"
