"""``draw_proposals``: the argmax-only path builds no distribution, the
confidence is the probability of the token actually proposed, and a batch with
a sampling row gets the full (filtered) distributions back."""

from __future__ import annotations

import torch

from speculant.config.sampling_params import SamplingParams
from speculant.engine.request import Request
from speculant.proposers.drafting import draw_proposals


def request(i: int, **params) -> Request:
    return Request(request_id=str(i), prompt=None, prompt_token_ids=[1, 2], params=SamplingParams(**params),
                   seed=100 + i, token_ids=[1, 2])


def logits(rows: int = 3, vocab: int = 11, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_all_greedy_gives_argmax_and_its_probability_without_distributions():
    lg = logits()
    reqs = [request(i, temperature=0) for i in range(3)]
    draw = draw_proposals(lg, reqs, step=0, with_confidence=True)
    assert draw.tokens == lg.argmax(dim=-1).tolist()
    assert draw.probs is None
    torch.testing.assert_close(draw.confidence, lg.softmax(dim=-1).max(dim=-1).values)
    assert draw_proposals(lg, reqs, step=0).confidence is None  # only computed when asked


def test_greedy_with_logprobs_still_builds_distributions():
    lg = logits()
    draw = draw_proposals(lg, [request(i, temperature=0, logprobs=1) for i in range(3)], step=0)
    assert draw.probs is not None
    torch.testing.assert_close(draw.probs, lg.softmax(dim=-1))


def test_mixed_batch_confidence_is_probability_of_the_drawn_token():
    lg = logits(seed=3)
    reqs = [request(0, temperature=0), request(1, temperature=1.0, top_k=3), request(2, temperature=0.5)]
    draw = draw_proposals(lg, reqs, step=1, with_confidence=True)
    assert draw.probs is not None and draw.probs.shape == lg.shape
    assert draw.tokens[0] == int(lg[0].argmax())
    for i, tok in enumerate(draw.tokens):
        assert draw.probs[i, tok] > 0  # never a token the filter removed
        torch.testing.assert_close(draw.confidence[i], draw.probs[i, tok])
    assert int((draw.probs[1] > 0).sum()) == 3  # top_k = 3 filtered row
