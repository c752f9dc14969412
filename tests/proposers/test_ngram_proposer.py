"""N-gram (prompt lookup) proposer: which match wins, budgets, the batch API,
options validation, agreement with a brute-force reference, and speed."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from speculant.config.sampling_params import SamplingParams
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.request import Request
from speculant.proposers.ngram import NgramOptions, NgramProposer, propose_continuation

CPU_CONTEXT = SimpleNamespace(target=SimpleNamespace(device=torch.device("cpu")))  # all ngram reads


def decode(tokens: list[int], k: int, request_id: str = "r") -> ScheduledRequest:
    req = Request(request_id=request_id, prompt=None, prompt_token_ids=tokens, params=SamplingParams(),
                  seed=0)
    return ScheduledRequest(request=req, num_new_tokens=1, num_spec_tokens=k)


# (tokens, k, min_n, max_n, expected proposal)
CASES = {
    "bigram match": ([1, 2, 3, 4, 1, 2], 3, 1, 3, [3, 4, 1]),
    "longest n preferred over a more recent shorter match": ([5, 7, 9, 8, 7, 6, 5, 7], 2, 1, 3, [9, 8]),
    "same sequence with max_n 1 takes the recent unigram": ([5, 7, 9, 8, 7, 6, 5, 7], 2, 1, 1, [6, 5]),
    "most recent occurrence": ([1, 2, 10, 1, 2, 20, 1, 2], 1, 1, 3, [20]),
    "k budget respected": ([1, 2, 3, 4, 5, 6, 1], 2, 1, 3, [2, 3]),
    "fewer tokens near the end": ([1, 2, 3, 1, 2], 5, 1, 3, [3, 1, 2]),
    "overlapping periodic match": ([4, 4, 4, 4], 3, 1, 3, [4]),
    "inside a loop an older occurrence gives the full k": ([4, 4, 4, 4, 4, 4, 4], 3, 1, 3, [4, 4, 4]),
    "period-2 loop: the recent match is short, an older one is full": ([1, 2, 1, 2, 1, 2, 1, 2], 4, 1, 2,
                                                                       [1, 2, 1, 2]),
    "a longer match still beats more continuation": ([7, 1, 2, 3, 4, 5, 9, 1, 2, 7, 1, 2], 3, 1, 3, [3, 4, 5]),
    "zero budget": ([1, 2, 1], 0, 1, 3, []),
    "no match": ([1, 2, 3, 4], 3, 1, 3, []),
    "match shorter than min_n": ([1, 2, 3, 4, 5, 3], 3, 2, 3, []),
    "single token": ([7], 3, 1, 3, []),
    "max_n longer than the sequence": ([3, 3], 2, 1, 5, [3]),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_proposal(case):
    tokens, k, min_n, max_n, expected = case
    assert propose_continuation(tokens, k, min_n, max_n) == expected


def reference(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The rule as stated: for n from max_n down to min_n, among the earlier
    occurrences of the last n tokens the one followed by the most tokens (up to
    k), the most recent of those; propose what follows it."""
    if k == 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        suffix = tokens[-n:]
        if n >= len(tokens):
            continue
        found = [tokens[start + n:start + n + k] for start in range(len(tokens) - n - 1, -1, -1)
                 if tokens[start:start + n] == suffix]
        if found:
            return max(found, key=len)  # max keeps the first (most recent) of equal lengths
    return []


def test_agrees_with_brute_force_reference():
    rng = random.Random(0)
    for _ in range(600):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        min_n = rng.randrange(1, 4)
        max_n = rng.randrange(min_n, 6)
        k = rng.randrange(0, 6)
        assert propose_continuation(tokens, k, min_n, max_n) == reference(tokens, k, min_n, max_n), (
            tokens, k, min_n, max_n)


def test_propose_returns_one_row_per_decode():
    batch = StepBatch(decodes=[
        decode([1, 2, 3, 1, 2], 2, "a"),
        decode([9, 8, 7], 4, "b"),  # no match
        decode([5, 6, 5, 6, 5], 0, "c"),  # no budget
        decode([5, 6, 7, 8, 5], 4, "d"),
    ])
    proposer = NgramProposer(NgramOptions(), CPU_CONTEXT)
    proposals = proposer.propose(batch)
    assert proposals.lens.tolist() == [2, 0, 0, 4]
    assert proposals.token_ids.tolist() == [3, 1, 6, 7, 8, 5]  # flat, decode after decode
    assert proposals.cu_num_draft_tokens.tolist() == [0, 2, 2, 2, 6]
    assert proposals.to_lists() == [[3, 1], [], [], [6, 7, 8, 5]]
    assert proposals.probs is None


def test_reads_generated_tokens_too():
    d = decode([1, 2, 3], 2)
    d.request.token_ids.extend([1, 2])  # generated after the prompt
    assert NgramProposer(NgramOptions(), CPU_CONTEXT).propose(StepBatch(decodes=[d])).row(0) == [3, 1]


def test_empty_batch():
    proposals = NgramProposer(NgramOptions(), CPU_CONTEXT).propose(StepBatch())
    assert proposals.token_ids.shape == (0,) and proposals.lens.shape == (0,)


def test_capabilities():
    caps = NgramProposer.capabilities
    assert NgramProposer.name == "ngram" and NgramProposer.Options is NgramOptions
    assert (caps.draft_probs, caps.needs_target_hidden_states, caps.supports_chunked_prefill,
            caps.max_num_speculative_tokens) == ("one_hot", False, True, None)


def test_min_n_above_max_n_is_refused_naming_both():
    with pytest.raises(ValidationError) as err:
        NgramOptions(min_n=4, max_n=2)
    message = str(err.value)
    assert "min_n=4" in message and "max_n=2" in message and "Set min_n <= max_n" in message


@pytest.mark.parametrize("options,fragment", [
    ({"min_n": 0}, "min_n"),
    ({"max_n": 0}, "max_n"),
    ({"max_m": 3}, "max_m"),
])
def test_invalid_options_name_the_option(options, fragment):
    with pytest.raises(ValidationError, match=fragment):
        NgramOptions(**options)


def test_fast_on_long_contexts():
    # 32 decodes x 4,000 tokens, the last token frequent but no long match: every
    # candidate is visited. Measured ~2 ms here; the bound only catches a blow-up.
    rng = random.Random(1)
    decodes = [decode([1 if i % 2 else rng.randrange(2, 500) for i in range(4000)], 4, str(j))
               for j in range(32)]
    proposer = NgramProposer(NgramOptions(min_n=2, max_n=3), CPU_CONTEXT)
    start = time.perf_counter()
    proposals = proposer.propose(StepBatch(decodes=decodes))
    assert time.perf_counter() - start < 0.5
    assert proposals.num_decodes == 32 and torch.all(proposals.lens <= 4)
