"""Turn raw logits into the distribution a request samples from.

One function serves the sampler, the acceptance methods and draft-model
proposers, so the target and draft distributions are always filtered the same
way (temperature, then top-k, top-p and min-p).
"""

from __future__ import annotations

import torch

from speculant.interfaces.sampling_params import MIN_TEMPERATURE, SamplingParams


def sampling_tensors(params: list[SamplingParams], device: torch.device) -> dict[str, torch.Tensor]:
    """Stack per-request settings into per-row tensors (one row per request)."""
    return {
        "temperature": torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        "top_k": torch.tensor([p.top_k if p.top_k > 0 else 0 for p in params], dtype=torch.long, device=device),
        "top_p": torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        "min_p": torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
    }


def filtered_logprobs(
    logits: torch.Tensor,  # [R, V] raw logits
    temperature: torch.Tensor,  # [R]; 0 (or below MIN_TEMPERATURE) means greedy (treated as 1 here)
    top_k: torch.Tensor,  # [R] long; 0 disables
    top_p: torch.Tensor,  # [R]; 1 disables
    min_p: torch.Tensor,  # [R]; 0 disables
) -> torch.Tensor:  # [R, V] float32 log-probabilities, -inf where filtered out
    """Log-probabilities of the distribution each row samples from.

    Greedy rows (temperature 0) get the unfiltered softmax of the raw logits:
    their token is the argmax, and these are the log-probabilities reported.
    A temperature below ``MIN_TEMPERATURE`` counts as greedy here too (a
    tiny divisor would overflow the scaled logits to inf and the row to NaN).
    """
    logits = logits.float()
    greedy = temperature < MIN_TEMPERATURE
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / temp.unsqueeze(1)
    filt_k = (top_k > 0) & ~greedy
    filt_p = (top_p < 1) & ~greedy
    if bool(filt_k.any()) or bool(filt_p.any()):
        sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
        remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if bool(filt_k.any()):
            ranks = torch.arange(scaled.shape[1], device=scaled.device).unsqueeze(0)
            k = torch.where(filt_k, top_k, torch.full_like(top_k, scaled.shape[1]))
            remove |= ranks >= k.unsqueeze(1)
        if bool(filt_p.any()):
            probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
            cum_before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
            remove |= (cum_before >= top_p.unsqueeze(1)) & filt_p.unsqueeze(1)
        remove[:, 0] = False  # the most likely token always survives
        mask = torch.zeros_like(remove).scatter(1, sorted_idx, remove)
        scaled = scaled.masked_fill(mask, float("-inf"))
    logprobs = scaled.log_softmax(dim=-1)
    filt_m = (min_p > 0) & ~greedy
    if bool(filt_m.any()):
        max_lp = logprobs.max(dim=-1, keepdim=True).values
        threshold = max_lp + torch.log(min_p.clamp_min(1e-30)).unsqueeze(1)
        drop = (logprobs < threshold) & filt_m.unsqueeze(1)
        logprobs = logprobs.masked_fill(drop, float("-inf")).log_softmax(dim=-1)
    return logprobs
