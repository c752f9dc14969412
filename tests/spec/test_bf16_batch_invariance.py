"""bfloat16 on the fused CPU path is batch-invariant end to end: every row of a forward is
computed on its own (the AVX512-BF16 linears sum each row in one order whatever the row count,
the norms, rotary and silu work row by row, and the C attention kernel takes every span, prefill
chunks cut into pieces, each row over its own keys in fixed tiles). So greedy output with
speculation, under chunked prefill and a batch of requests landing in varying step layouts,
equals each request run alone without speculation, token for token, as in float32; and seeded
sampling with speculation equals each request run alone through the same engine. Hypothesis
draws the requests (derandomized: the same examples every run; ``-m slow`` draws hundreds);
the engines are built once per architecture and proposer. Every example verifies drafts, and
every proposer has drafts accepted, or the test would prove little."""

from __future__ import annotations

from collections import Counter

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
# sampled: proposals must not depend on other requests (the suffix proposer's global cache would
# hold the solo runs' outputs), so its cache is off there
SAMPLED_PROPOSERS = ("draft_model", "ngram", "suffix_own")
EXAMPLES, SLOW_EXAMPLES = 12, 300
MAX_TOKENS = 24
ENGINE = dict(dtype="bfloat16", fast_forward="on", block_size=4, max_num_batched_tokens=20, max_num_seqs=6,
              max_model_len=160)
SAMPLED_BUDGET = 40  # at least max_num_seqs decodes of 1 + k (k = 5 at most): never trims a decode's k


@pytest.fixture(scope="module")
def engines(zoo):
    """(arch, proposer or None, token budget) -> LLM; built on first use."""
    built: dict[tuple[str, str | None, int], LLM] = {}

    def get(arch: str, proposer: str | None, budget: int = ENGINE["max_num_batched_tokens"]) -> LLM:
        if (arch, proposer, budget) not in built:
            spec: dict = {}
            if proposer == "draft_model":  # a noisy copy of the target: its drafts are often accepted
                spec = {"speculative": {"proposer": proposer, "num_speculative_tokens": 4,
                                        "proposer_options": {"model": str(zoo(arch, draft=True))}}}
            elif proposer == "suffix_own":  # the suffix proposer on each request's own text only
                spec = {"speculative": {"proposer": "suffix", "num_speculative_tokens": 5,
                                        "proposer_options": {"max_cached_requests": 0}}}
            elif proposer is not None:  # accepted on the repeated patterns
                spec = {"speculative": {"proposer": proposer, "num_speculative_tokens": 5}}
            llm = built[(arch, proposer, budget)] = LLM(str(zoo(arch)), **{**ENGINE, "max_num_batched_tokens": budget},
                                                        **spec)
            assert expect_fast_forward(llm) == (["target", "draft"] if proposer == "draft_model" else ["target"])
        return built[(arch, proposer, budget)]
    return get


def requests(draw_lengths: list[int], repeats: list[int], seed: int) -> list[list[int]]:
    """Random prompts and a short pattern repeated (the tiny models go on repeating a pattern they
    were shown often enough, so the proposers' drafts are accepted); the last one repeats it 10 times."""
    plain = random_prompts(draw_lengths, seed=seed)
    pattern = random_prompts([5], seed=seed + 1)[0]
    return plain + [pattern * r for r in repeats] + [pattern * 10]


def check(engines, arch: str, proposer: str, lengths: list[int], repeats: list[int], seed: int,
          sampled: bool) -> int:
    """One drawn batch; returns how many drafts were accepted."""
    prompts = requests(lengths, repeats, seed)
    if sampled:  # each request its own seed; the solo runs go through the speculating engine too
        params = [SamplingParams(temperature=0.3, top_k=20, top_p=0.95, seed=seed + i, max_tokens=MAX_TOKENS,
                                 ignore_eos=True) for i in range(len(prompts))]
    else:
        params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)] * len(prompts)
    # sampled: the budget never trims a decode's k (it would draw other proposals alone and in a
    # batch, and a sampled output depends on its proposals; a greedy one does not)
    spec = engines(arch, proposer, SAMPLED_BUDGET) if sampled else engines(arch, proposer)
    alone = spec if sampled else engines(arch, None)
    solo = [alone.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids for p, sp in zip(prompts, params)]
    spec.engine.reset_metrics()
    batched = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    assert batched == solo
    metrics = spec.get_metrics()
    assert metrics["num_draft_tokens"] > 0, "nothing was verified: the test proved little"
    if proposer == "draft_model":  # a noisy copy of the target: accepted in every batch
        assert metrics["num_accepted_tokens"] > 0, "no draft was accepted: the test proved little"
    return metrics["num_accepted_tokens"]


COMMON = dict(deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def check_examples(engines, max_examples: int, proposers: tuple[str, ...], sampled: bool) -> None:
    """``max_examples`` drawn batches (derandomized), then: every architecture and proposer was
    drawn, and each proposer had drafts accepted (the n-gram and suffix proposers only now and
    then on the random tiny models: counted over all the examples, not per batch)."""
    drawn: Counter = Counter()
    accepted: Counter = Counter()

    @settings(max_examples=max_examples, **COMMON)
    @given(arch=st.sampled_from(ARCHS), proposer=st.sampled_from(proposers),
           lengths=st.lists(st.integers(1, 60), min_size=1, max_size=5),
           repeats=st.lists(st.integers(2, 8), min_size=1, max_size=3), seed=st.integers(0, 2**16))
    def examples(arch, proposer, lengths, repeats, seed):
        accepted[proposer] += check(engines, arch, proposer, lengths, repeats, seed, sampled)
        drawn.update([arch, proposer])

    examples()
    assert set(drawn) == set(ARCHS) | set(proposers), drawn
    assert all(accepted[p] > 0 for p in proposers), f"no draft accepted in any example: {dict(accepted)}"


def test_speculative_batches_equal_solo_runs_without_speculation(engines):
    check_examples(engines, EXAMPLES, PROPOSERS, sampled=False)


def test_sampled_speculative_batches_equal_solo_runs(engines):
    check_examples(engines, EXAMPLES, SAMPLED_PROPOSERS, sampled=True)


@pytest.mark.slow
def test_speculative_batches_equal_solo_runs_without_speculation_slow(engines):
    check_examples(engines, SLOW_EXAMPLES, PROPOSERS, sampled=False)


@pytest.mark.slow
def test_sampled_speculative_batches_equal_solo_runs_slow(engines):
    check_examples(engines, SLOW_EXAMPLES, SAMPLED_PROPOSERS, sampled=True)
