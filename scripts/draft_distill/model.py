"""The draft's shape and its starting point.

The draft is a small Llama with the target's vocabulary, special tokens and
rotary settings, and tied input/output embeddings (with a 49k vocabulary the
embedding is most of its parameters). Its embedding starts as the target's
projected onto its top principal directions, so tokens the target treats
alike start alike in the draft, and the tied output layer starts as the best
rank-``hidden`` approximation of the target's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")


@dataclass(frozen=True)
class DraftShape:
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384


def draft_config(target_cfg: dict, shape: DraftShape) -> LlamaConfig:
    """A Llama config of ``shape`` sharing the target's vocabulary, special ids and positions."""
    extra = {k: target_cfg[k] for k in ROPE_KEYS if target_cfg.get(k) is not None}
    return LlamaConfig(
        vocab_size=target_cfg["vocab_size"], hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads, rms_norm_eps=target_cfg.get("rms_norm_eps", 1e-5),
        tie_word_embeddings=True, bos_token_id=target_cfg.get("bos_token_id"),
        eos_token_id=target_cfg.get("eos_token_id"), pad_token_id=target_cfg.get("pad_token_id"),
        initializer_range=0.02, use_cache=True, **extra)


@torch.no_grad()
def projected_embedding(target_emb: torch.Tensor,  # [V, H_target]
                        hidden: int) -> torch.Tensor:  # [V, hidden]
    """The target's embedding rows on its ``hidden`` principal directions (PCA, uncentred
    so that the tied output layer keeps the mean direction too), scaled to entries of
    RMS ``hidden ** -0.5``: a normed hidden state then gives logits of unit scale."""
    emb = target_emb.float()
    _, _, vh = torch.linalg.svd(emb.T @ emb)  # [H, H] Gram matrix: cheap for a 49k vocabulary
    proj = emb @ vh[:hidden].T
    return proj * (hidden ** -0.5 / proj.pow(2).mean().sqrt())


def build_draft(target_cfg: dict, target_emb: torch.Tensor,  # [V, H_target]
                shape: DraftShape, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(draft_config(target_cfg, shape))
    model.get_input_embeddings().weight.data.copy_(projected_embedding(target_emb, shape.hidden))
    model.tie_weights()
    return model


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
