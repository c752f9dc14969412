"""Medusa heads: k heads on the target's last hidden state.

Head j (0-based) is ``num_layers`` residual blocks ``x + SiLU(W x + b)``
followed by its own LM head (or the target's, ``share_lm_head``). From the
hidden state h_t that produced token t+1, head j predicts token t+2+j: the
heads do not see each other's guesses.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import cast

import torch
from torch import nn

from speculant.interfaces.batch import RequestView
from speculant.proposers.heads.common import HiddenStateProposer

MODEL_TYPE = "speculant_medusa"


class ResidualBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, H] -> [n, H]
        return x + nn.functional.silu(self.linear(x))


class MedusaHead(nn.Module):
    def __init__(self, hidden: int, vocab: int, num_layers: int, own_lm_head: bool) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[ResidualBlock(hidden) for _ in range(num_layers)])
        self.lm_head = nn.Linear(hidden, vocab, bias=False) if own_lm_head else None


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 share_lm_head: bool = False) -> None:
        super().__init__()
        self.heads = nn.ModuleList(
            MedusaHead(hidden_size, vocab_size, num_layers, not share_lm_head) for _ in range(num_heads))

    @classmethod
    def from_config(cls, cfg: dict) -> MedusaHeads:
        return cls(cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"], cfg.get("num_layers", 1),
                   cfg.get("share_lm_head", False))

    def forward(self, hidden: torch.Tensor,  # [n, H]
                lm_head: nn.Module | None = None) -> torch.Tensor:  # [num_heads, n, V]
        outs = []
        for head in cast("Iterable[MedusaHead]", self.heads):  # nn.ModuleList iterates as plain Modules
            z = head.blocks(hidden)
            proj = head.lm_head or lm_head
            if proj is None:
                raise TypeError("a Medusa head without its own LM head (share_lm_head) needs lm_head")
            outs.append(proj(z))
        return torch.stack(outs)


def medusa_config(hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                  share_lm_head: bool = False) -> dict:
    return {"model_type": MODEL_TYPE, "hidden_size": hidden_size, "vocab_size": vocab_size,
            "num_heads": num_heads, "num_layers": num_layers, "share_lm_head": share_lm_head}


class MedusaProposer(HiddenStateProposer):
    name = "medusa"
    api_version = "3.0"
    model_type = MODEL_TYPE

    @classmethod
    def max_tokens(cls, head_cfg: dict) -> int:
        return int(head_cfg["num_heads"])

    def build_heads(self, head_cfg: dict) -> nn.Module:
        return MedusaHeads.from_config(head_cfg)

    def head_logits(self, hidden: torch.Tensor, last_tokens: torch.Tensor, requests: list[RequestView],
                    k: int) -> Generator[torch.Tensor, torch.Tensor, None]:
        lm_head = self.context.target.output_embedding
        all_logits = self.heads(hidden, lm_head)  # [num_heads, n, V]
        for j in range(k):
            yield all_logits[j]  # the drawn tokens sent back are not needed: heads are independent
