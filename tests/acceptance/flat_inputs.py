"""Padded test tables -> the flat layout the acceptance methods take, and
their result back to the tables' width, so cases stay readable as
``[n, k + 1, V]`` / ``[n, k]`` tables with ``PLACEHOLDER_TOKEN_ID``."""

from __future__ import annotations

import torch

from speculant.interfaces import PLACEHOLDER_TOKEN_ID, AcceptanceMethod, AcceptedTokens, Proposals
from speculant.sampling.acceptance import greedy_accept


def flatten(target: torch.Tensor,  # [n, k + 1, V]
            ids: torch.Tensor,  # [n, k]
            probs: torch.Tensor | None,  # [n, k, V] or None
            lens: torch.Tensor,  # [n]
            ) -> tuple[torch.Tensor, Proposals]:  # target rows [n + T, V], flat proposals
    rows = torch.arange(target.shape[1]).unsqueeze(0) <= lens.unsqueeze(1)  # [n, k + 1]
    return target[rows], Proposals.from_padded(ids, lens, probs)


def repad(out: AcceptedTokens, width: int) -> AcceptedTokens:
    pad = width - out.token_ids.shape[1]
    return AcceptedTokens(torch.nn.functional.pad(out.token_ids, (0, pad), value=PLACEHOLDER_TOKEN_ID),
                          out.num_accepted)


def accept_padded(method: AcceptanceMethod, target, ids, probs, lens, greedy, generators) -> AcceptedTokens:
    """``method.accept`` on padded tables; token_ids come back ``[n, k + 1]``."""
    flat_target, p = flatten(target, ids, probs, lens)
    out = method.accept(flat_target, p.token_ids, p.cu_num_draft_tokens, p.probs, greedy, generators)
    return repad(out, ids.shape[1] + 1)


def greedy_padded(logits, ids, lens) -> AcceptedTokens:
    """``greedy_accept`` on padded tables; token_ids come back ``[n, k + 1]``."""
    flat_logits, p = flatten(logits, ids, None, lens)
    return repad(greedy_accept(flat_logits, p.token_ids, p.cu_num_draft_tokens), ids.shape[1] + 1)
