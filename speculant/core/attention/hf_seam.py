"""Register our attention with transformers' AttentionInterface.

Models loaded with ``attn_implementation=SEAM_NAME`` call
``speculant_attention`` in every layer, and the mask interface returns None so
transformers builds no dense mask: the paged backend knows the layout.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from speculant.core.attention.context import current_forward_context

SEAM_NAME = "speculant"


def speculant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, H, T, D]
    key: torch.Tensor,  # [1, H_kv, T, D]
    value: torch.Tensor,  # [1, H_kv, T, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    ctx = current_forward_context()
    layer = module.layer_idx
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("attention logit soft-capping reached the speculant seam; "
                                  "the model should have been refused at load")
    q = query[0].transpose(0, 1)  # [T, H, D]
    k = key[0].transpose(0, 1)  # [T, H_kv, D]
    v = value[0].transpose(0, 1)
    if scaling is None:
        scaling = q.shape[-1] ** -0.5
    if ctx.on_layer is not None:
        ctx.on_layer(layer, k, v)
        return torch.zeros_like(q).unsqueeze(0), None
    out = ctx.backend.forward(q, k, v, ctx.key_caches[layer], ctx.value_caches[layer], ctx.metadata, scaling)
    return out.unsqueeze(0), None  # [1, T, H, D]


def _no_mask(*args, **kwargs) -> None:
    return None


def register_seam() -> str:
    """Idempotently register the attention function and the null mask."""
    AttentionInterface.register(SEAM_NAME, speculant_attention)
    AttentionMaskInterface.register(SEAM_NAME, _no_mask)
    return SEAM_NAME
