"""Sample one token per row from filtered distributions, with per-request
random streams.

Each request owns its randomness: the generator for a draw is seeded from the
request's seed and how many tokens it has produced, so the same seed gives the
same tokens whatever else shares the batch, and a preempted request redraws
exactly what it drew before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from speculant.interfaces.sampling_params import SamplingParams
from speculant.sampling.logits_processing import filtered_logprobs, sampling_tensors


class Request(Protocol):
    """What sampling reads of a request (the engine's ``Request`` has it): no engine state."""

    @property
    def seed(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def params(self) -> SamplingParams: ...


_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio) for seed mixing
ACCEPT_STREAM = 1  # the target-side draw of a step (sampling or acceptance)
DRAFT_STREAM = 2  # draft-side draws: DRAFT_STREAM + proposal index


def request_generator(request: Request, stream: int = 0) -> torch.Generator:
    """CPU generator for the request's next draw (``stream`` separates the
    uses within one step, e.g. acceptance vs. draft sampling)."""
    seed = (request.seed * _MIX + request.num_output_tokens * 1_000_003 + stream * 7919) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


def draw_uniforms(
    generators: list[torch.Generator],  # [m]
    counts: list[int],  # [m] uniforms to draw from each generator
    device: torch.device,
) -> torch.Tensor:  # [sum(counts)] float64, generator i's draws at sum(counts[:i]) onwards
    """Draw ``counts[i]`` uniforms in [0, 1) from ``generators[i]`` and nothing else,
    so a row's draws do not depend on which rows share its batch. The generators
    are host (CPU) generators (``request_generator``): the draws cost no device
    synchronisation, and reach ``device`` in one host-to-device copy."""
    parts = [torch.rand(count, generator=gen, dtype=torch.float64) for gen, count in zip(generators, counts) if count]
    if not parts:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.cat(parts).to(device)


def sample_from_probs(
    probs: torch.Tensor,  # [m, V] non-negative, unnormalized, positive mass per row
    uniforms: torch.Tensor,  # [m] float64 in [0, 1)
) -> torch.Tensor:  # [m] long
    """Inverse-CDF sampling: the first token whose cumulative mass exceeds u * total.
    Zero-mass tokens are never returned. A row without a usable distribution
    (NaN or infinite mass, or none at all) gets its most probable finite
    entry (token 0 if none), so the result is always an id in [0, V)."""
    probs = probs.double()
    bad = ~torch.isfinite(probs).all(dim=1) | ~(probs.sum(dim=1) > 0)  # [m]
    if bool(bad.any()):
        fallback = torch.nan_to_num(probs[bad], nan=-1.0, posinf=-1.0, neginf=-1.0).argmax(dim=1)
        probs = probs.clone()
        probs[bad] = 0.0
        probs[bad, fallback] = 1.0
    cdf = probs.cumsum(dim=1)  # [m, V]
    total = cdf[:, -1:].contiguous()  # [m, 1]
    idx = torch.searchsorted(cdf, uniforms.unsqueeze(1) * total, right=True)  # [m, 1]
    last_with_mass = torch.searchsorted(cdf, total, right=False)  # [m, 1]; guards u * total rounding to total
    return torch.minimum(idx, last_with_mass).squeeze(1).clamp_(0, probs.shape[1] - 1)



@dataclass(frozen=True)
class SampledTokens:
    token_ids: list[int]
    logprobs: torch.Tensor | None  # [R, V] log-probs each row sampled from; None when no row needs them


def sample(logits: torch.Tensor,  # [R, V] raw target logits, one row per request
           requests: Sequence[Request]) -> SampledTokens:
    assert logits.shape[0] == len(requests)
    if not requests:
        return SampledTokens([], logits.float())
    params = [r.params for r in requests]
    if all(p.greedy and p.logprobs is None for p in params):
        return SampledTokens(logits.argmax(dim=-1).tolist(), None)  # no distribution needed
    t = sampling_tensors(params, logits.device)
    logprobs = filtered_logprobs(logits, **t)
    tokens = logprobs.argmax(dim=-1).tolist()
    rows = [i for i, r in enumerate(requests) if not r.params.greedy]
    if rows:
        # the same generator stream and draw as an acceptance method's final token,
        # so a request samples the same token whether or not its batch speculates
        uniforms = draw_uniforms([request_generator(requests[i], ACCEPT_STREAM) for i in rows],
                                 [1] * len(rows), logits.device)
        drawn = sample_from_probs(logprobs[rows].exp(), uniforms).tolist()
        for i, tok in zip(rows, drawn):
            tokens[i] = tok
    return SampledTokens(tokens, logprobs)


def top_logprobs(logprobs: torch.Tensor,  # [V] log-probs of one position
                 token_id: int, num: int) -> dict[int, float]:
    """The chosen token's log-probability plus the ``num`` most likely ones."""
    out = {}
    if num > 0:
        values, ids = logprobs.topk(min(num, logprobs.shape[-1]))
        # tokens the filters removed (-inf) are not among the top alternatives
        out = {int(i): float(v) for i, v in zip(ids, values) if v > float("-inf")}
    out[int(token_id)] = float(logprobs[token_id])
    return out
