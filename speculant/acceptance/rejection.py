"""Lossless modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

The small functions below the class are shared with the other acceptance
methods: input checks, greedy argmax, per-row random draws and inverse-CDF sampling
(prefix counting and assembly live in ``speculant.core.acceptance``).
"""

from __future__ import annotations

import torch

from speculant.core.acceptance import AcceptanceMethod, AcceptedTokens, accepted_prefix_len, assemble_accepted
from speculant.core.capabilities import AcceptanceCapabilities
from speculant.core.sampler import draw_uniforms, sample_from_probs


class RejectionSampler(AcceptanceMethod):
    """Keep proposals so that emitted tokens follow the target distribution exactly.

    Vocabulary, per row i with ``lens[i]`` proposals x_0..x_{lens-1}:
    - p_j: the target distribution at position j (already filtered by the caller);
    - q_j: the draft distribution x_j was drawn from; a one-hot on x_j when
      ``draft_probs`` is None (n-gram and other deterministic proposers);
    - accepted token: x_j kept with probability min(1, p_j(x_j) / q_j(x_j));
    - recovered token: at the first rejected position j, a sample from
      normalize(max(0, p_j - q_j)), or from p_j when that residual has no mass
      left (p <= q everywhere, which only rounding produces);
    - bonus token: when all ``lens[i]`` proposals are accepted, a sample from
      p_{lens[i]}. A row with ``lens[i] == 0`` simply samples from p_0.

    Random draws (the reproducibility contract): a sampling row i draws exactly
    ``torch.rand(lens[i] + 1, generator=generators[i], dtype=torch.float64)``
    once per step and nothing else. Uniform u_j (j < lens[i]) decides x_j
    (accepted iff u_j * q_j(x_j) < p_j(x_j)); uniform u_{lens[i]} picks the
    recovered or bonus token by inverting the cumulative distribution. Uniforms
    after the first rejection go unused. A row's result therefore depends only
    on its own inputs and generator, never on the other rows of the batch.

    Greedy rows draw nothing: they keep proposals equal to the target argmax
    and emit the argmax at the first mismatch (or after the last proposal).
    """

    name = "rejection"
    capabilities = AcceptanceCapabilities(needs_draft_probs=False, lossless=True, supports_sampling=True)

    def accept(
        self,
        target_logprobs: torch.Tensor,  # [n, k_max + 1, V] filtered target log-probs
        draft_token_ids: torch.Tensor,  # [n, k_max] long, PLACEHOLDER_TOKEN_ID past lens
        draft_probs: torch.Tensor | None,  # [n, k_max, V] filtered draft probs, or None (one-hot)
        lens: torch.Tensor,  # [n] long, proposals per row
        greedy: torch.Tensor,  # [n] bool, temperature == 0 rows
        generators: list[torch.Generator],  # [n] one per row
    ) -> AcceptedTokens:
        check_accept_inputs(target_logprobs, draft_token_ids, draft_probs, lens, greedy, generators)
        n, k_max = draft_token_ids.shape
        token_ids = draft_token_ids.clamp_min(0)  # [n, k_max]; placeholders are masked by lens
        counts = [0 if g else int(l) + 1 for l, g in zip(lens.tolist(), greedy.tolist())]
        uniforms = draw_uniforms(generators, counts, k_max + 1, target_logprobs.device)  # [n, k_max + 1]

        p_draft = target_logprobs[:, :k_max].gather(2, token_ids.unsqueeze(2)).squeeze(2).exp()  # [n, k_max]
        if draft_probs is None:
            q_draft = torch.ones_like(p_draft)
        else:
            q_draft = draft_probs.gather(2, token_ids.unsqueeze(2)).squeeze(2)  # [n, k_max]
        # u < p/q without dividing: q = 0 accepts iff p > 0, and p >= q always accepts (u < 1).
        sampled_ok = uniforms[:, :k_max] * q_draft < p_draft  # [n, k_max]
        argmax = target_argmax(target_logprobs, greedy)  # [n, k_max + 1]
        accept = torch.where(greedy.unsqueeze(1), token_ids == argmax[:, :k_max], sampled_ok)
        num_accepted = accepted_prefix_len(accept, lens)  # [n]

        final = argmax[torch.arange(n, device=argmax.device), num_accepted]  # [n]; greedy rows are done
        rows = (~greedy).nonzero().squeeze(1)  # [m] sampling rows
        if rows.numel() > 0:
            pos = num_accepted[rows]  # [m]
            dist = self._final_distribution(target_logprobs, token_ids, draft_probs, lens, rows, pos)
            final[rows] = sample_from_probs(dist, uniforms[rows, lens[rows]])
        return assemble_accepted(draft_token_ids, num_accepted, final)

    @staticmethod
    def _final_distribution(
        target_logprobs: torch.Tensor,  # [n, k_max + 1, V]
        token_ids: torch.Tensor,  # [n, k_max] long, placeholders clamped to 0
        draft_probs: torch.Tensor | None,  # [n, k_max, V] or None
        lens: torch.Tensor,  # [n]
        rows: torch.Tensor,  # [m] sampling rows
        pos: torch.Tensor,  # [m] position of the token to emit (= num_accepted)
    ) -> torch.Tensor:  # [m, V] unnormalized distribution to sample from
        """Residual max(0, p - q) for rejected rows, p itself for bonus rows."""
        p = target_logprobs[rows, pos].exp()  # [m, V]
        k_max = token_ids.shape[1]
        if k_max == 0:
            return p
        rejected = pos < lens[rows]  # [m]
        qpos = pos.clamp_max(k_max - 1)  # [m]; bonus rows read a dummy position, unused
        if draft_probs is None:  # one-hot q: the residual is p without the rejected token
            residual = p.scatter(1, token_ids[rows, qpos].unsqueeze(1), 0.0)
        else:
            residual = (p - draft_probs[rows, qpos]).clamp_min(0.0)
        use_residual = rejected & (residual.sum(dim=1) > 0)  # [m]
        return torch.where(use_residual.unsqueeze(1), residual, p)


def check_accept_inputs(
    target_logprobs: torch.Tensor,  # [n, k_max + 1, V]
    draft_token_ids: torch.Tensor,  # [n, k_max]
    draft_probs: torch.Tensor | None,  # [n, k_max, V] or None
    lens: torch.Tensor,  # [n]
    greedy: torch.Tensor,  # [n] bool
    generators: list[torch.Generator],  # [n]
) -> None:
    """Assert the shapes and ranges every acceptance method relies on."""
    assert target_logprobs.dim() == 3 and draft_token_ids.dim() == 2, "expected [n, k+1, V] and [n, k]"
    n, k_max = draft_token_ids.shape
    vocab = target_logprobs.shape[2]
    assert target_logprobs.shape[:2] == (n, k_max + 1), (
        f"target_logprobs {tuple(target_logprobs.shape)} does not match draft_token_ids {(n, k_max)}")
    assert draft_probs is None or draft_probs.shape == (n, k_max, vocab), (
        f"draft_probs {tuple(draft_probs.shape)} should be {(n, k_max, vocab)}")
    assert lens.shape == (n,) and greedy.shape == (n,) and greedy.dtype == torch.bool
    assert len(generators) == n, f"{len(generators)} generators for {n} rows"
    assert bool(((lens >= 0) & (lens <= k_max)).all()), f"lens must be in [0, {k_max}]: {lens.tolist()}"
    in_lens = torch.arange(k_max, device=lens.device).unsqueeze(0) < lens.unsqueeze(1)  # [n, k_max]
    in_vocab = (draft_token_ids >= 0) & (draft_token_ids < vocab)
    assert bool((in_vocab | ~in_lens).all()), "a proposal inside lens is not a token id of the vocabulary"


def target_argmax(
    target_logprobs: torch.Tensor,  # [n, k_max + 1, V]
    greedy: torch.Tensor,  # [n] bool
) -> torch.Tensor:  # [n, k_max + 1] long; meaningful on greedy rows only (0 elsewhere)
    """The greedy token at every position, computed only when a greedy row needs it."""
    if not bool(greedy.any()):
        return torch.zeros(target_logprobs.shape[:2], dtype=torch.long, device=target_logprobs.device)
    if bool(greedy.all()):
        return target_logprobs.argmax(dim=-1)
    out = torch.zeros(target_logprobs.shape[:2], dtype=torch.long, device=target_logprobs.device)
    out[greedy] = target_logprobs[greedy].argmax(dim=-1)
    return out
