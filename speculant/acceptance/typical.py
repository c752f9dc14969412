"""Typical acceptance (Cai et al. 2024, "Medusa"): keep proposals the target finds
plausible enough, instead of matching the target distribution exactly."""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from speculant.acceptance.rejection import check_accept_inputs, target_argmax
from speculant.core.acceptance import AcceptanceMethod, AcceptedTokens, accepted_prefix_len, assemble_accepted
from speculant.core.sampler import draw_uniforms, sample_from_probs
from speculant.core.capabilities import AcceptanceCapabilities


class TypicalOptions(BaseModel):
    """Options of the ``typical`` acceptance method."""

    model_config = ConfigDict(extra="forbid")

    posterior_threshold: float = Field(default=0.09, ge=0.0, le=1.0)
    """Hard cap on the probability a proposal needs: a proposal with target
    probability above this is always kept. Lower keeps more proposals."""
    posterior_alpha: float = Field(default=0.3, ge=0.0, le=1.0)
    """Scale of the entropy-dependent threshold alpha * exp(-H(p)): where the target
    is unsure (high entropy), less probable proposals are kept. Lower keeps more."""


class TypicalAcceptance(AcceptanceMethod):
    """Keep each proposal the target considers typical; not lossless.

    Vocabulary, per row i with ``lens[i]`` proposals x_0..x_{lens-1} and p_j the
    target distribution at position j (already filtered by the caller):
    - accepted token: x_j with p_j(x_j) > min(posterior_threshold,
      posterior_alpha * exp(-H(p_j))), H the entropy in nats. Every proposal is
      tested, the first one included: progress is guaranteed by the token
      emitted after them, so nothing needs to be kept unconditionally.
    - recovered token: at the first rejected position j, a sample from p_j (the
      rejected proposal may be drawn again);
    - bonus token: after all proposals are accepted, a sample from p_{lens[i]}.
    Sampling the emitted token (rather than taking the argmax) keeps the
    request's temperature meaningful; with ``lens[i] == 0`` the row is exactly
    ordinary sampling. Draft probabilities are ignored.

    Random draws: a sampling row i draws exactly
    ``torch.rand(1, generator=generators[i], dtype=torch.float64)`` per step,
    used to invert the cumulative distribution of the emitted token. Greedy rows
    draw nothing and behave as in ``rejection``: keep proposals equal to the
    target argmax, then emit the argmax, so greedy output is exact.
    """

    name = "typical"
    capabilities = AcceptanceCapabilities(needs_draft_probs=False, lossless=False, supports_sampling=True)
    Options: ClassVar[type[BaseModel]] = TypicalOptions

    def __init__(self, options: TypicalOptions | None = None) -> None:
        super().__init__(options if options is not None else TypicalOptions())

    def accept(
        self,
        target_logprobs: torch.Tensor,  # [n, k_max + 1, V] filtered target log-probs
        draft_token_ids: torch.Tensor,  # [n, k_max] long, PLACEHOLDER_TOKEN_ID past lens
        draft_probs: torch.Tensor | None,  # [n, k_max, V] or None; ignored
        lens: torch.Tensor,  # [n] long, proposals per row
        greedy: torch.Tensor,  # [n] bool, temperature == 0 rows
        generators: list[torch.Generator],  # [n] one per row
    ) -> AcceptedTokens:
        check_accept_inputs(target_logprobs, draft_token_ids, draft_probs, lens, greedy, generators)
        n, k_max = draft_token_ids.shape
        token_ids = draft_token_ids.clamp_min(0)  # [n, k_max]; placeholders are masked by lens

        rows = (~greedy).nonzero().squeeze(1)  # [m] sampling rows
        argmax = target_argmax(target_logprobs, greedy)  # [n, k_max + 1]
        accept = token_ids == argmax[:, :k_max]  # [n, k_max]; the greedy rule
        if rows.numel() > 0:
            accept[rows] = self.typical_mask(target_logprobs[rows, :k_max], token_ids[rows])
        num_accepted = accepted_prefix_len(accept, lens)  # [n]

        final = argmax[torch.arange(n, device=argmax.device), num_accepted]  # [n]; greedy rows are done
        if rows.numel() > 0:
            uniforms = draw_uniforms([generators[i] for i in rows.tolist()], [1] * rows.numel(), 1,
                                     target_logprobs.device)  # [m, 1]
            p = target_logprobs[rows, num_accepted[rows]].exp()  # [m, V]
            final[rows] = sample_from_probs(p, uniforms[:, 0])
        return assemble_accepted(draft_token_ids, num_accepted, final)

    def typical_mask(
        self,
        logprobs: torch.Tensor,  # [n, k, V] target log-probs at the proposal positions
        token_ids: torch.Tensor,  # [n, k] long, valid ids
    ) -> torch.Tensor:  # [n, k] bool: the proposal passes the typical-acceptance rule
        probs = logprobs.exp()  # [n, k, V]
        finite = logprobs.clamp_min(torch.finfo(logprobs.dtype).min)  # filtered tokens: 0 * min = 0
        entropy = -(probs * finite).sum(dim=-1)  # [n, k] in nats
        threshold = (self.options.posterior_alpha * torch.exp(-entropy)).clamp_max(
            self.options.posterior_threshold)  # [n, k]
        return probs.gather(2, token_ids.unsqueeze(2)).squeeze(2) > threshold
