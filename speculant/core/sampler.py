"""Sample one token per row from filtered distributions, with per-request
random streams.

Each request owns its randomness: the generator for a draw is seeded from the
request's seed and how many tokens it has produced, so the same seed gives the
same tokens whatever else shares the batch, and a preempted request redraws
exactly what it drew before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.core.logits_processing import filtered_logprobs, sampling_tensors
from speculant.core.request import Request

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio) for seed mixing


def request_generator(request: Request, stream: int = 0) -> torch.Generator:
    """CPU generator for the request's next draw (``stream`` separates the
    uses within one step, e.g. acceptance vs. draft sampling)."""
    seed = (request.seed * _MIX + request.num_output_tokens * 1_000_003 + stream * 7919) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


def sample_from_probs(probs: torch.Tensor,  # [V] probabilities of one row
                      generator: torch.Generator) -> int:
    """Exponential-race sampling: argmax(p / E) with E ~ Exp(1) is a draw from p."""
    noise = torch.empty(probs.shape[-1], dtype=torch.float32).exponential_(generator=generator)
    return int(torch.argmax(probs.float().cpu() / noise))


@dataclass(frozen=True)
class SampledTokens:
    token_ids: list[int]
    logprobs: torch.Tensor  # [R, V] log-probabilities of the distribution each row used


def sample(logits: torch.Tensor,  # [R, V] raw target logits, one row per request
           requests: list[Request]) -> SampledTokens:
    assert logits.shape[0] == len(requests)
    if not requests:
        return SampledTokens([], logits.float())
    params = [r.params for r in requests]
    t = sampling_tensors(params, logits.device)
    logprobs = filtered_logprobs(logits, **t)
    tokens = logprobs.argmax(dim=-1).tolist()
    for i, req in enumerate(requests):
        if not req.params.greedy:
            tokens[i] = sample_from_probs(logprobs[i].exp(), request_generator(req))
    return SampledTokens(tokens, logprobs)


def top_logprobs(logprobs: torch.Tensor,  # [V] log-probs of one position
                 token_id: int, num: int) -> dict[int, float]:
    """The chosen token's log-probability plus the ``num`` most likely ones."""
    out = {}
    if num > 0:
        values, ids = logprobs.topk(min(num, logprobs.shape[-1]))
        out = {int(i): float(v) for i, v in zip(ids, values)}
    out[int(token_id)] = float(logprobs[token_id])
    return out
