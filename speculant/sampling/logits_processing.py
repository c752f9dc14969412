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


CANDIDATES = 256
"""Tokens a row's top-k / top-p cut is first looked for among: its most likely
ones, found by a partial selection. A row whose cut lies further sorts its
whole vocabulary. A full sort of SmolLM2's 49k vocabulary costs about 2.7 ms on
2 cores (0.4 of a decode), and a verify step filters every one of its rows."""


def _cut(
    vals: torch.Tensor,  # [R, C] a row's C most likely scaled logits, descending
    filt_k: torch.Tensor,  # [R] bool
    top_k: torch.Tensor,  # [R] long
    filt_p: torch.Tensor,  # [R] bool
    top_p: torch.Tensor,  # [R]
    log_mass: torch.Tensor,  # [R] logsumexp of the whole row
) -> tuple[torch.Tensor, torch.Tensor]:  # ([R, C] bool remove, [R] bool: nothing after the C survives)
    """Which of the C ranked tokens top-k then top-p remove, and whether the cut lies
    within the C (always so when they are the whole vocabulary)."""
    width = vals.shape[1]
    ranks = torch.arange(width, device=vals.device).unsqueeze(0)
    k = torch.where(filt_k, top_k, torch.full_like(top_k, width + 1))
    remove = ranks >= k.unsqueeze(1)
    within = k <= width  # top-k removes everything after the C
    if bool(filt_p.any()):
        kept = vals.masked_fill(remove, float("-inf"))
        # top-p renormalises over top-k's survivors (all of them among the C where ``within``)
        denominator = torch.where(within, kept.logsumexp(dim=-1), log_mass)
        probs = (kept - denominator.unsqueeze(1)).exp()
        cum = probs.cumsum(dim=-1)
        remove |= ((cum - probs) >= top_p.unsqueeze(1)) & filt_p.unsqueeze(1)
        # the mass reaches top_p among the C; a top-k reaching past them renormalises over tokens unseen here
        within |= filt_p & ~filt_k & (cum[:, -1] >= top_p)
    remove[:, 0] = False  # the most likely token always survives
    return remove, within


def rank_filter_mask(
    scaled: torch.Tensor,  # [R, V] temperature-scaled logits
    filt_k: torch.Tensor,  # [R] bool: the row applies top-k
    top_k: torch.Tensor,  # [R] long
    filt_p: torch.Tensor,  # [R] bool: the row applies top-p
    top_p: torch.Tensor,  # [R]
) -> torch.Tensor:  # [R, V] bool, True where top-k or top-p removes the token
    """Top-k, then top-p over top-k's survivors (the smallest set of most likely
    tokens whose mass reaches top_p); rows applying neither keep every token. The
    cut is first looked for among each row's ``CANDIDATES`` most likely tokens;
    rows whose cut lies beyond them sort their whole vocabulary. Among tokens of
    equal logit at the cut, which ones survive is the selection's choice (the
    same for a row whatever else is in the batch)."""
    mask = torch.zeros_like(scaled, dtype=torch.bool)
    active = (filt_k | filt_p).nonzero().flatten()
    if scaled.shape[1] > CANDIDATES:
        sub = scaled[active]
        vals, idx = sub.topk(CANDIDATES, dim=-1)  # descending
        remove, within = _cut(vals, filt_k[active], top_k[active], filt_p[active], top_p[active],
                              sub.logsumexp(dim=-1))
        part = torch.ones_like(sub, dtype=torch.bool).scatter(1, idx, remove)
        mask[active[within]] = part[within]
        active = active[~within]
    if active.numel():
        sub = scaled[active]
        vals, idx = sub.sort(dim=-1, descending=True)
        remove, _ = _cut(vals, filt_k[active], top_k[active], filt_p[active], top_p[active],
                         sub.logsumexp(dim=-1))
        mask[active] = torch.zeros_like(remove).scatter(1, idx, remove)
    return mask


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
        scaled = scaled.masked_fill(rank_filter_mask(scaled, filt_k, top_k, filt_p, top_p), float("-inf"))
    logprobs = scaled.log_softmax(dim=-1)
    filt_m = (min_p > 0) & ~greedy
    if bool(filt_m.any()):
        max_lp = logprobs.max(dim=-1, keepdim=True).values
        threshold = max_lp + torch.log(min_p.clamp_min(1e-30)).unsqueeze(1)
        drop = (logprobs < threshold) & filt_m.unsqueeze(1)
        logprobs = logprobs.masked_fill(drop, float("-inf")).log_softmax(dim=-1)
    return logprobs
