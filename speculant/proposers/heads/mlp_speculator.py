"""MLP speculator: a chain of small MLP stages on the target's hidden state.

Stage j mixes the running state (the target's last hidden state for j = 0)
with the embedding of the previous token (the target's newest token, then
each drawn proposal), normalizes, and predicts proposal j:

    s_j = GELU(LayerNorm(proj_j(s_{j-1}) * a + emb_j(x_{j-1}) * b)),  logits_j = head_j(s_j)

with a = 0.5 ** (0.5 / n_predict) and b = sqrt(1 - a^2), so the state and
the token contribute comparable variance whatever the number of stages.
"""

from __future__ import annotations

import math
from collections.abc import Generator

import torch
from torch import nn

from speculant.interfaces.batch import RequestView
from speculant.proposers.heads.common import HiddenStateProposer

MODEL_TYPE = "speculant_mlp_speculator"


class MLPSpeculator(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, n_predict: int, inner_dim: int | None = None) -> None:
        super().__init__()
        inner = inner_dim or hidden_size
        self.n_predict = n_predict
        self.emb = nn.ModuleList(nn.Embedding(vocab_size, inner) for _ in range(n_predict))
        self.proj = nn.ModuleList(
            nn.Linear(hidden_size if j == 0 else inner, inner, bias=False) for j in range(n_predict))
        self.norm = nn.ModuleList(nn.LayerNorm(inner) for _ in range(n_predict))
        self.head = nn.ModuleList(nn.Linear(inner, vocab_size, bias=False) for _ in range(n_predict))
        self.state_weight = 0.5 ** (0.5 / n_predict)
        self.emb_weight = math.sqrt(1 - self.state_weight**2)

    @classmethod
    def from_config(cls, cfg: dict) -> MLPSpeculator:
        return cls(cfg["hidden_size"], cfg["vocab_size"], cfg["n_predict"], cfg.get("inner_dim"))

    def stage(self, j: int, state: torch.Tensor,  # [n, H or inner]
              prev_tokens: torch.Tensor,  # [n] long
              ) -> tuple[torch.Tensor, torch.Tensor]:  # new state [n, inner], logits [n, V]
        mixed = self.proj[j](state) * self.state_weight + self.emb[j](prev_tokens) * self.emb_weight
        state = nn.functional.gelu(self.norm[j](mixed))
        return state, self.head[j](state)

    def forward(self, hidden: torch.Tensor,  # [n, H]
                tokens: torch.Tensor,  # [n, n_predict] teacher-forced previous tokens
                ) -> torch.Tensor:  # [n_predict, n, V]
        state, outs = hidden, []
        for j in range(self.n_predict):
            state, logits = self.stage(j, state, tokens[:, j])
            outs.append(logits)
        return torch.stack(outs)


def mlp_speculator_config(hidden_size: int, vocab_size: int, n_predict: int, inner_dim: int | None = None) -> dict:
    return {"model_type": MODEL_TYPE, "hidden_size": hidden_size, "vocab_size": vocab_size,
            "n_predict": n_predict, "inner_dim": inner_dim or hidden_size}


class MLPSpeculatorProposer(HiddenStateProposer):
    name = "mlp_speculator"
    api_version = "3.0"
    model_type = MODEL_TYPE
    heads: MLPSpeculator  # built by build_heads

    @classmethod
    def max_tokens(cls, head_cfg: dict) -> int:
        return int(head_cfg["n_predict"])

    def build_heads(self, head_cfg: dict) -> nn.Module:
        return MLPSpeculator.from_config(head_cfg)

    def head_logits(self, hidden: torch.Tensor, last_tokens: torch.Tensor, requests: list[RequestView],
                    k: int) -> Generator[torch.Tensor, torch.Tensor, None]:
        state, prev = hidden, last_tokens
        for j in range(k):
            state, logits = self.heads.stage(j, state, prev)
            prev = yield logits  # the proposal drawn from these logits conditions the next stage
