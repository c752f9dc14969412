"""Register our attention with transformers' AttentionInterface.

Models loaded with ``attn_implementation=SEAM_NAME`` call
``speculant_attention`` in every layer, and the mask interface returns None so
transformers builds no dense mask: the paged backend knows the layout. Every
model passes the load-time probe (``seam_probe``) and self-test
(``core/seam_selftest.py``) first, so anything it asks of attention beyond
causal softmax over its own keys is refused at load, not ignored here.
"""

from __future__ import annotations

from typing import cast

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from speculant.model.attention.context import current_forward_context
from speculant.model.attention.seam_probe import describe_call

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
    if ctx.on_layer is not None:  # the load-time probe: record what the model asks for, attend to nothing
        ctx.on_layer(describe_call(module, query, key, value, attention_mask, {"dropout": dropout, **kwargs}))
        t, h = query.shape[2], query.shape[1]
        return query.new_zeros(1, t, h, value.shape[-1]), None
    q = query[0].transpose(0, 1)  # [T, H, D]
    k = key[0].transpose(0, 1)  # [T, H_kv, D]
    v = value[0].transpose(0, 1)
    if scaling is None:
        scaling = q.shape[-1] ** -0.5
    layer = cast(int, module.layer_idx)  # a plain int attribute (nn.Module's __getattr__ types it Tensor | Module)
    out = ctx.backend.forward(q, k, v, ctx.key_caches[layer], ctx.value_caches[layer], ctx.metadata, scaling)
    return out.unsqueeze(0), None  # [1, T, H, D]


def _no_mask(*args, **kwargs) -> None:
    return None


def register_seam() -> str:
    """Idempotently register the attention function and the null mask."""
    AttentionInterface.register(SEAM_NAME, speculant_attention)
    AttentionMaskInterface.register(SEAM_NAME, _no_mask)
    return SEAM_NAME
