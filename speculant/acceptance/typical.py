"""Typical acceptance (Cai et al. 2024, "Medusa"): keep proposals the target finds
plausible enough, instead of matching the target distribution exactly."""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from speculant.acceptance.rejection import check_accept_inputs, target_argmax
from speculant.interfaces import AcceptanceCapabilities, AcceptanceMethod, AcceptedTokens
from speculant.sampling.acceptance import DraftLayout, accepted_prefix_len, assemble_accepted
from speculant.sampling.sampler import draw_uniforms, sample_from_probs


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
    api_version = "3.0"
    capabilities = AcceptanceCapabilities(needs_draft_probs=False, lossless=False, supports_sampling=True,
                                          supports_structured_output=True)
    Options: ClassVar[type[BaseModel]] = TypicalOptions
    options: TypicalOptions  # __init__ substitutes the defaults for None

    def __init__(self, options: TypicalOptions | None = None) -> None:
        super().__init__(options if options is not None else TypicalOptions())

    def accept(
        self,
        target_logprobs: torch.Tensor,  # [n + T, V] filtered target log-probs, flat
        draft_token_ids: torch.Tensor,  # [T] long
        cu_num_draft_tokens: torch.Tensor,  # [n + 1] long
        draft_probs: torch.Tensor | None,  # [T, V] or None; ignored
        greedy: torch.Tensor,  # [n] bool, temperature == 0 rows
        generators: list[torch.Generator],  # [n] one per row
    ) -> AcceptedTokens:
        check_accept_inputs(target_logprobs, draft_token_ids, cu_num_draft_tokens, draft_probs, greedy, generators)
        layout = DraftLayout.of(cu_num_draft_tokens, draft_token_ids.shape[0])

        rows = (~greedy).nonzero().squeeze(1)  # [m] sampling rows
        argmax = target_argmax(target_logprobs, greedy.repeat_interleave(layout.lens + 1,
                                                                          output_size=target_logprobs.shape[0]))
        accept = draft_token_ids == argmax[layout.logit_rows]  # [T]; the greedy rule
        sampled = (~greedy)[layout.token_rows]  # [T] proposals of sampling rows
        if bool(sampled.any()):
            accept[sampled] = self.typical_mask(target_logprobs[layout.logit_rows[sampled]],
                                                draft_token_ids[sampled])
        num_accepted = accepted_prefix_len(accept, layout)  # [n]

        final_rows = layout.cu_num_logits[:-1] + num_accepted  # [n]
        final = argmax[final_rows]  # [n]; greedy rows are done
        if rows.numel() > 0:
            uniforms = draw_uniforms([generators[i] for i in rows.tolist()], [1] * rows.numel(),
                                     target_logprobs.device)  # [m]
            p = target_logprobs[final_rows[rows]].exp()  # [m, V]
            final[rows] = sample_from_probs(p, uniforms)
        return assemble_accepted(draft_token_ids, layout, num_accepted, final)

    def typical_mask(
        self,
        logprobs: torch.Tensor,  # [m, V] target log-probs at the proposals' positions
        token_ids: torch.Tensor,  # [m] long, valid ids
    ) -> torch.Tensor:  # [m] bool: the proposal passes the typical-acceptance rule
        probs = logprobs.exp()  # [m, V]
        finite = logprobs.clamp_min(torch.finfo(logprobs.dtype).min)  # filtered tokens: 0 * min = 0
        entropy = -(probs * finite).sum(dim=-1)  # [m] in nats
        threshold = (self.options.posterior_alpha * torch.exp(-entropy)).clamp_max(
            self.options.posterior_threshold)  # [m]
        return probs.gather(1, token_ids.unsqueeze(1)).squeeze(1) > threshold
