"""Helpers every acceptance method shares (the interface is
``speculant.interfaces.AcceptanceMethod``).

Vocabulary, per decode with k proposals:
- accepted tokens: the longest prefix of the proposals the method keeps;
- recovered token: sampled in place of the first rejected proposal;
- bonus token: sampled from the target after all k proposals were accepted.
Every decode therefore emits ``num_accepted + 1`` tokens.

Layout: flat, as ``Proposals`` and ``Scores`` hand it over. Decode i's
proposals are ``draft_token_ids[cu_num_draft_tokens[i]:cu_num_draft_tokens[i + 1]]``
and its ``1 + lens[i]`` target rows follow each other in ``target_logprobs``
(``cu_num_logits = cu_num_draft_tokens + arange(n + 1)``), so proposal t of the
flat list is scored by target row ``t + (its decode index)``. Vocabulary-wide
work (filtering, log-softmax, argmax) touches real rows only; the per-decode
prefix logic runs on small index tensors (``DraftLayout``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.interfaces import PLACEHOLDER_TOKEN_ID, AcceptedTokens


@dataclass(frozen=True)
class DraftLayout:
    """Index tensors of one step's flat layout (all on the proposals' device)."""

    cu_num_draft_tokens: torch.Tensor  # [n + 1] long
    lens: torch.Tensor  # [n] long
    token_rows: torch.Tensor  # [T] long: the decode each proposal belongs to
    logit_rows: torch.Tensor  # [T] long: the target row scoring each proposal
    cu_num_logits: torch.Tensor  # [n + 1] long: each decode's first target row

    @classmethod
    def of(cls, cu_num_draft_tokens: torch.Tensor,  # [n + 1] long
           num_draft_tokens: int) -> DraftLayout:
        cu = cu_num_draft_tokens
        n, device = cu.shape[0] - 1, cu.device
        lens = cu.diff()
        rows = torch.repeat_interleave(torch.arange(n, device=device), lens, output_size=num_draft_tokens)
        return cls(cu, lens, rows, torch.arange(num_draft_tokens, device=device) + rows,
                   cu + torch.arange(n + 1, device=device))

    @property
    def positions(self) -> torch.Tensor:  # [T] long: index of each proposal inside its decode
        return self.logit_rows - self.cu_num_logits[self.token_rows]


def accepted_prefix_len(
    accept: torch.Tensor,  # [T] bool, per-proposal verdicts
    layout: DraftLayout,
) -> torch.Tensor:  # [n] long: leading accepted proposals of each decode, at most lens[i]
    """The first rejected position of each decode (a segment minimum, no padding)."""
    first_rejected = torch.where(accept, layout.lens[layout.token_rows], layout.positions)  # [T]
    return layout.lens.scatter_reduce(0, layout.token_rows, first_rejected, reduce="amin")


def assemble_accepted(
    draft_token_ids: torch.Tensor,  # [T] long
    layout: DraftLayout,
    num_accepted: torch.Tensor,  # [n] long
    final_token_ids: torch.Tensor,  # [n] long, recovered or bonus token
) -> AcceptedTokens:
    """Accepted proposals, then the final token, then PLACEHOLDER_TOKEN_ID;
    one gather from the flat proposals builds the small [n, max(lens) + 1] table."""
    n = num_accepted.shape[0]
    k_max = int(layout.lens.max()) if n else 0
    cols = torch.arange(k_max + 1, device=num_accepted.device).unsqueeze(0)  # [1, k_max + 1]
    if draft_token_ids.numel():
        src = (layout.cu_num_draft_tokens[:-1].unsqueeze(1) + cols).clamp_max(draft_token_ids.shape[0] - 1)
        taken = draft_token_ids[src]  # [n, k_max + 1]; entries past num_accepted are replaced below
    else:
        taken = torch.full((n, k_max + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=num_accepted.device)
    token_ids = torch.where(cols < num_accepted.unsqueeze(1), taken, PLACEHOLDER_TOKEN_ID)
    token_ids.scatter_(1, num_accepted.unsqueeze(1), final_token_ids.unsqueeze(1))
    return AcceptedTokens(token_ids=token_ids, num_accepted=num_accepted)


def verifies_by_argmax(requests: list) -> bool:
    """True when every request is greedy and none asks for log-probabilities:
    verification then needs only the target's argmax (``greedy_accept``), and
    no target or draft distribution has to be built."""
    return all(r.params.greedy and r.params.logprobs is None for r in requests)


def greedy_accept(
    target_logits: torch.Tensor,  # [n + T, V] raw target logits, flat
    draft_token_ids: torch.Tensor,  # [T] long
    cu_num_draft_tokens: torch.Tensor,  # [n + 1] long
) -> AcceptedTokens:
    """Greedy verification, the rule every acceptance method applies to
    temperature-0 rows: keep proposals equal to the target argmax, then emit
    the argmax. The argmax of the raw logits is the token plain greedy decoding
    picks, so the engine uses this directly when every row is greedy."""
    layout = DraftLayout.of(cu_num_draft_tokens, draft_token_ids.shape[0])
    argmax = target_logits.argmax(dim=-1)  # [n + T]
    num_accepted = accepted_prefix_len(draft_token_ids == argmax[layout.logit_rows], layout)
    final = argmax[layout.cu_num_logits[:-1] + num_accepted]  # [n]
    return assemble_accepted(draft_token_ids, layout, num_accepted, final)
