"""The engine's all-greedy verification (``greedy_accept`` on raw logits) keeps
exactly what every acceptance method keeps for greedy rows, and
``verifies_by_argmax`` picks that path only when no distribution is needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flat_inputs import accept_padded, greedy_padded
from speculant.acceptance.rejection import RejectionSampler
from speculant.acceptance.typical import TypicalAcceptance
from speculant.config.sampling_params import SamplingParams
from speculant.interfaces import PLACEHOLDER_TOKEN_ID
from speculant.sampling.acceptance import verifies_by_argmax

P = PLACEHOLDER_TOKEN_ID


def random_batch(seed: int, n: int = 6, k: int = 4, vocab: int = 7):
    """Logits with few distinct tokens so proposals often equal the argmax."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k + 1, vocab, generator=g) * 3
    argmax = logits.argmax(dim=-1)
    ids = torch.where(torch.rand(n, k, generator=g) < 0.7, argmax[:, :k], torch.randint(0, vocab, (n, k), generator=g))
    lens = torch.randint(0, k + 1, (n,), generator=g)
    ids = torch.where(torch.arange(k).unsqueeze(0) < lens.unsqueeze(1), ids, P)
    return logits, ids, lens


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("method", [RejectionSampler, TypicalAcceptance])
def test_same_tokens_as_every_method_on_greedy_rows(seed, method):
    logits, ids, lens = random_batch(seed)
    n = ids.shape[0]
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    expected = accept_padded(method(method.Options()), logits.log_softmax(dim=-1), ids, None, lens,
                             torch.ones(n, dtype=torch.bool), gens)
    got = greedy_padded(logits, ids, lens)
    assert torch.equal(got.num_accepted, expected.num_accepted)
    assert torch.equal(got.token_ids, expected.token_ids)


def test_crafted_rows():
    # argmax per position: 2, 0, 4, 1
    logits = torch.full((3, 4, 5), -1.0)
    for pos, tok in enumerate([2, 0, 4, 1]):
        logits[:, pos, tok] = 3.0
    ids = torch.tensor([[2, 0, 4], [2, 3, 4], [P, P, P]])
    lens = torch.tensor([3, 3, 0])
    out = greedy_padded(logits, ids, lens)
    assert out.num_accepted.tolist() == [3, 1, 0]
    assert out.token_ids.tolist() == [[2, 0, 4, 1], [2, 0, P, P], [2, P, P, P]]


@pytest.mark.parametrize("params,expected", [
    ([SamplingParams(temperature=0)], True),
    ([SamplingParams(temperature=0), SamplingParams(temperature=0, max_tokens=3)], True),
    ([SamplingParams(temperature=0, logprobs=2)], False),
    ([SamplingParams(temperature=0), SamplingParams(temperature=0.7)], False),
])
def test_verifies_by_argmax(params, expected):
    assert verifies_by_argmax([SimpleNamespace(params=p) for p in params]) is expected
