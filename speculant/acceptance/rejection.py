"""Lossless modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

The small functions below the class are shared with the other acceptance
methods: input checks, greedy argmax, per-row random draws and inverse-CDF sampling
(prefix counting and assembly live in ``speculant.sampling.acceptance``).
"""

from __future__ import annotations

import torch

from speculant.interfaces import AcceptanceCapabilities, AcceptanceMethod, AcceptedTokens, Proposals
from speculant.sampling.acceptance import DraftLayout, accepted_prefix_len, assemble_accepted
from speculant.sampling.sampler import draw_uniforms, sample_from_probs
from speculant.sampling.tree_acceptance import tree_accept


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
    api_version = "3.0"
    capabilities = AcceptanceCapabilities(needs_draft_probs=False, lossless=True, supports_sampling=True,
                                          supports_structured_output=True, accepts_trees=True)

    def accept(
        self,
        target_logprobs: torch.Tensor,  # [n + T, V] filtered target log-probs, flat
        draft_token_ids: torch.Tensor,  # [T] long
        cu_num_draft_tokens: torch.Tensor,  # [n + 1] long
        draft_probs: torch.Tensor | None,  # [T, V] filtered draft probs, or None (one-hot)
        greedy: torch.Tensor,  # [n] bool, temperature == 0 rows
        generators: list[torch.Generator],  # [n] one per row
    ) -> AcceptedTokens:
        check_accept_inputs(target_logprobs, draft_token_ids, cu_num_draft_tokens, draft_probs, greedy, generators)
        layout = DraftLayout.of(cu_num_draft_tokens, draft_token_ids.shape[0])
        num_tokens = draft_token_ids.shape[0]
        # uniforms laid out like the target rows: row i's lens[i] + 1 draws at cu_num_logits[i]..
        uniforms = row_uniforms(generators, layout, greedy, target_logprobs.shape[0])  # [n + T]

        p_draft = target_logprobs[layout.logit_rows, draft_token_ids].exp()  # [T]
        if draft_probs is None:
            q_draft = torch.ones_like(p_draft)
        else:
            q_draft = draft_probs[torch.arange(num_tokens, device=draft_probs.device), draft_token_ids]  # [T]
        # u < p/q without dividing: q = 0 accepts iff p > 0, and p >= q always accepts (u < 1).
        sampled_ok = uniforms[layout.logit_rows] * q_draft < p_draft  # [T]
        argmax = target_argmax(target_logprobs, greedy.repeat_interleave(layout.lens + 1,
                                                                          output_size=target_logprobs.shape[0]))
        accept = torch.where(greedy[layout.token_rows], draft_token_ids == argmax[layout.logit_rows], sampled_ok)
        num_accepted = accepted_prefix_len(accept, layout)  # [n]

        final_rows = layout.cu_num_logits[:-1] + num_accepted  # [n] target row of the emitted token
        final = argmax[final_rows]  # [n]; greedy rows are done
        rows = (~greedy).nonzero().squeeze(1)  # [m] sampling rows
        if rows.numel() > 0:
            dist = self._final_distribution(target_logprobs, draft_token_ids, draft_probs, layout, rows,
                                            num_accepted[rows], final_rows[rows])
            final[rows] = sample_from_probs(dist, uniforms[layout.cu_num_logits[1:][rows] - 1])
        return assemble_accepted(draft_token_ids, layout, num_accepted, final)

    def accept_tree(self, target_logprobs: torch.Tensor,  # [n + T, V]
                    proposals: Proposals, greedy: torch.Tensor,  # [n] bool
                    generators: list[torch.Generator]) -> AcceptedTokens:
        """Token trees: multi-candidate rejection over the siblings (``sampling.tree_acceptance``)."""
        return tree_accept(target_logprobs, proposals, greedy, generators)

    @staticmethod
    def _final_distribution(
        target_logprobs: torch.Tensor,  # [n + T, V]
        draft_token_ids: torch.Tensor,  # [T] long
        draft_probs: torch.Tensor | None,  # [T, V] or None
        layout: DraftLayout,
        rows: torch.Tensor,  # [m] sampling rows
        pos: torch.Tensor,  # [m] position of the token to emit (= num_accepted)
        target_rows: torch.Tensor,  # [m] target row at that position
    ) -> torch.Tensor:  # [m, V] unnormalized distribution to sample from
        """Residual max(0, p - q) for rejected rows, p itself for bonus rows."""
        p = target_logprobs[target_rows].exp()  # [m, V]
        num_tokens = draft_token_ids.shape[0]
        if num_tokens == 0:
            return p
        rejected = pos < layout.lens[rows]  # [m]
        # the rejected proposal's flat index; bonus rows read a dummy entry, unused
        qidx = (layout.cu_num_draft_tokens[rows] + pos).clamp_max(num_tokens - 1)  # [m]
        if draft_probs is None:  # one-hot q: the residual is p without the rejected token
            residual = p.scatter(1, draft_token_ids[qidx].unsqueeze(1), 0.0)
        else:
            residual = (p - draft_probs[qidx]).clamp_min(0.0)
        use_residual = rejected & (residual.sum(dim=1) > 0)  # [m]
        return torch.where(use_residual.unsqueeze(1), residual, p)


def row_uniforms(
    generators: list[torch.Generator],  # [n]
    layout: DraftLayout,
    greedy: torch.Tensor,  # [n] bool
    num_rows: int,  # n + T
) -> torch.Tensor:  # [n + T] float64; sampling row i's draws at its target rows, 1.0 elsewhere
    """Each sampling row's ``lens[i] + 1`` uniforms, placed like its target rows."""
    out = torch.ones(num_rows, dtype=torch.float64, device=layout.lens.device)
    sampling = [i for i, g in enumerate(greedy.tolist()) if not g]
    if sampling:
        lens = layout.lens.tolist()
        drawn = draw_uniforms([generators[i] for i in sampling], [lens[i] + 1 for i in sampling], out.device)
        out[(~greedy).repeat_interleave(layout.lens + 1, output_size=num_rows)] = drawn
    return out


def check_accept_inputs(
    target_logprobs: torch.Tensor,  # [n + T, V]
    draft_token_ids: torch.Tensor,  # [T]
    cu_num_draft_tokens: torch.Tensor,  # [n + 1]
    draft_probs: torch.Tensor | None,  # [T, V] or None
    greedy: torch.Tensor,  # [n] bool
    generators: list[torch.Generator],  # [n]
) -> None:
    """Assert the shapes and ranges every acceptance method relies on."""
    assert target_logprobs.dim() == 2 and draft_token_ids.dim() == 1 and cu_num_draft_tokens.dim() == 1, \
        "expected flat [n + T, V], [T] and [n + 1]"
    n, num_tokens = cu_num_draft_tokens.shape[0] - 1, draft_token_ids.shape[0]
    vocab = target_logprobs.shape[1]
    assert target_logprobs.shape[0] == n + num_tokens, (
        f"target_logprobs has {target_logprobs.shape[0]} rows, expected {n} decodes + {num_tokens} proposals")
    assert draft_probs is None or tuple(draft_probs.shape) == (num_tokens, vocab), (
        f"draft_probs {tuple(draft_probs.shape)} should be {(num_tokens, vocab)}")
    assert greedy.shape == (n,) and greedy.dtype == torch.bool
    assert len(generators) == n, f"{len(generators)} generators for {n} rows"
    assert int(cu_num_draft_tokens[0]) == 0 and int(cu_num_draft_tokens[-1]) == num_tokens and \
        bool((cu_num_draft_tokens.diff() >= 0).all()), f"bad cu_num_draft_tokens {cu_num_draft_tokens.tolist()}"
    assert bool(((draft_token_ids >= 0) & (draft_token_ids < vocab)).all()), \
        "a proposal is not a token id of the vocabulary"


def target_argmax(
    target_logprobs: torch.Tensor,  # [R, V]
    greedy: torch.Tensor,  # [R] bool, rows of greedy requests
) -> torch.Tensor:  # [R] long; meaningful on greedy rows only (0 elsewhere)
    """The greedy token at every row, computed only where a greedy request needs it."""
    if not bool(greedy.any()):
        return torch.zeros(target_logprobs.shape[0], dtype=torch.long, device=target_logprobs.device)
    if bool(greedy.all()):
        return target_logprobs.argmax(dim=-1)
    out = torch.zeros(target_logprobs.shape[0], dtype=torch.long, device=target_logprobs.device)
    out[greedy] = target_logprobs[greedy].argmax(dim=-1)
    return out
