"""The fast decoder: the llama family's forward as one loop over prepared layers.

transformers' modules cost about 200 us of Python and small operators per
layer at decode sizes (module calls, hooks, shape plumbing, separate q/k/v and
gate/up projections, two rotary passes). This loop computes the same
arithmetic with the fewest operators: per layer the input norm, one q/k/v
GEMM, rotary on q and k together from a cos/sin table indexed once per
forward, the K/V write and paged attention through the runner's attention
backend (the very call the reference path's seam makes), the output
projection added in place to the residual (fused into the linear kernel where
the packed kind has that, bit for bit the same), the post-attention norm, one
gate/up GEMM, ``silu(gate) * up``, the down projection added in place. It
returns the final normed hidden states, where transformers' base model
returns them, so the LM head, samplers and hidden-state proposers are
unchanged.

Exactness: every rounding step is the reference's. Rotary is
``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) * sin`` computed as
``roll(x, D/2) * sin_signed`` (``sin_signed`` = sin with its first half
negated: ``(-a) * b == a * (-b)`` exactly; in bfloat16 on the CPU one C call,
``csrc/rotary.c``, with the same roundings), the residual adds round as
``residual + out`` does, and the cos/sin table holds the rotary module's own
output for each position.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from speculant.interfaces import AttentionBackend
from speculant.model.fast_forward.fused_layers import FusedLayers, silu_table
from speculant.model.fast_forward.plan import Plan, base_of
from speculant.model.fast_forward.weights import LayerWeights, layer_weights, norm_call
from speculant.model.kernels.build import load_kernel
from speculant.model.linear.quantized import QuantEmbedding

MAX_TABLE_POSITIONS = 1 << 16
"""Longest cos/sin table kept (positions); longer models compute cos/sin per forward."""


class RotaryTable:
    """cos / sin ``[P, D]`` in the model's dtype, straight from the model's rotary module."""

    def __init__(self, rotary: nn.Module, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rotary, self.dtype, self.device = rotary, dtype, device
        self.cos: torch.Tensor | None = None
        self.sin_signed: torch.Tensor | None = None
        if max_positions <= MAX_TABLE_POSITIONS:
            positions = torch.arange(max_positions, device=device)
            self.cos, self.sin_signed = self._compute(positions)

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] long -> cos [T, D], sin with its first half negated [T, D]
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(probe, positions.unsqueeze(0))
        cos, sin = cos[0], sin[0].clone()
        half = sin.shape[-1] // 2
        sin[:, :half].neg_()
        return cos.contiguous(), sin

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] long -> cos, sin_signed [T, 1, D] (broadcast over heads)
        if self.cos is None or self.sin_signed is None:
            cos, sin = self._compute(positions)
        else:
            cos, sin = self.cos.index_select(0, positions), self.sin_signed.index_select(0, positions)
        return cos.unsqueeze(1), sin.unsqueeze(1)


def _rotate_torch(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    # qk: [T, heads, D]; cos, sin (first half negated): [T, 1, D] -> [T, heads, D]
    rotated = qk.roll(half, -1).mul_(sin)
    return (qk * cos).add_(rotated)


def rotary_call(like: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """Rotary for tensors like ``like``: the C kernel (``csrc/rotary.c``, the same
    roundings in one call) for bfloat16 on the CPU where it loads, else torch's four operators."""
    lib = load_kernel() if like.dtype == torch.bfloat16 and like.device.type == "cpu" else None
    if lib is None:
        return _rotate_torch
    kernel = lib.speculant_rotary_bf16

    def rotate(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
        tokens, heads, dim = qk.shape
        if qk.stride(2) != 1 or qk.stride(1) != dim or not (cos.is_contiguous() and sin.is_contiguous()):
            return _rotate_torch(qk, cos, sin, half)
        out = torch.empty(tokens, heads, dim, dtype=torch.bfloat16)
        kernel(qk.data_ptr(), tokens, qk.stride(0), heads, dim, cos.data_ptr(), sin.data_ptr(), out.data_ptr())
        return out
    return rotate



def _silu_mul_torch(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    # gate_up: [T, 2 I] -> silu(gate) * up [T, I]
    return F.silu(gate_up[:, :inter]).mul_(gate_up[:, inter:])


def silu_mul_call(like: torch.Tensor, inter: int) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """``silu(gate) * up`` for tensors like ``like``: for bfloat16 on the CPU one C call
    (``csrc/silu_mul.c``) with silu read from a table that torch's own ``F.silu`` filled over all
    65,536 bfloat16 values, so the bits are torch's; else torch's two operators. Taken only for
    widths that torch's vectorised loops cover without a scalar tail (multiples of 64), which
    could round differently from the table."""
    lib = load_kernel() if like.dtype == torch.bfloat16 and like.device.type == "cpu" else None
    if lib is None or inter % 64:
        return _silu_mul_torch
    kernel = lib.speculant_silu_mul_bf16
    table = silu_table()

    def silu_mul(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
        if gate_up.stride(1) != 1 or gate_up.dtype != torch.bfloat16 or gate_up.shape[1] != 2 * inter:
            return _silu_mul_torch(gate_up, inter)
        out = torch.empty(gate_up.shape[0], inter, dtype=torch.bfloat16)
        kernel(gate_up.data_ptr(), gate_up.shape[0], gate_up.stride(0), inter, table.data_ptr(), out.data_ptr())
        return out
    return silu_mul


class FastDecoder:
    """The base model's forward for one flattened batch (see the module docstring)."""

    def __init__(self, model: Any, plan: Plan, max_model_len: int) -> None:
        base = base_of(model)
        self.plan = plan
        embed = base.embed_tokens
        # ids [T] -> [T, H]: a dense table, or one kept in GGUF blocks (model.quantization = "gguf")
        self.lookup = embed if isinstance(embed, QuantEmbedding) else functools.partial(F.embedding,
                                                                                         weight=embed.weight)
        self.embed = torch.empty(0, dtype=model.dtype, device=model.device)  # the dtype and device of activations
        self.final_norm = norm_call(base.norm)
        self.layers: list[LayerWeights] = [layer_weights(layer) for layer in base.layers]
        self.rotary = RotaryTable(base.rotary_emb, max_model_len, self.embed.dtype, self.embed.device)
        self.qk_heads = plan.num_heads + plan.num_kv_heads
        self.qk_width = self.qk_heads * plan.head_dim
        self.half = plan.head_dim // 2
        self.rotate = rotary_call(self.embed)
        self.silu_mul = silu_mul_call(self.embed, plan.intermediate_size)
        # every layer in one C call where all its pieces are our C kernels (fused_layers.py)
        self.fused, self.fused_reason = FusedLayers.build(base, plan)

    def forward(self, token_ids: torch.Tensor,  # [T] long
                positions: torch.Tensor,  # [T] long
                backend: AttentionBackend, metadata,
                key_caches: list[torch.Tensor],  # per layer [num_blocks, block_size, H_kv, D]
                value_caches: list[torch.Tensor]) -> torch.Tensor:  # -> [T, H] final normed hidden states
        plan = self.plan
        num_tokens, num_heads, head_dim = token_ids.shape[0], plan.num_heads, plan.head_dim
        qk_heads, qk_width, half, inter = self.qk_heads, self.qk_width, self.half, plan.intermediate_size
        attend, scaling, rotate, silu_mul = backend.forward, plan.scaling, self.rotate, self.silu_mul
        cos, sin = self.rotary.lookup(positions)
        hidden = self.lookup(token_ids)  # [T, H], the residual stream, updated in place
        if self.fused is not None and self.fused.takes(backend, metadata, key_caches):
            self.fused.run(hidden, cos, sin, metadata, key_caches, value_caches)
            return self.final_norm(hidden)
        for lw, key_cache, value_cache in zip(self.layers, key_caches, value_caches):
            qkv = lw.qkv(lw.input_norm(hidden))  # [T, (H_q + 2 H_kv) D]
            qk = qkv[:, :qk_width].view(num_tokens, qk_heads, head_dim)
            qk = rotate(qk, cos, sin, half)  # [T, H_q + H_kv, D]
            v = qkv[:, qk_width:].view(num_tokens, -1, head_dim)
            out = attend(qk[:, :num_heads], qk[:, num_heads:], v, key_cache, value_cache, metadata, scaling)
            lw.o_add(out.reshape(num_tokens, num_heads * head_dim), hidden)
            gate_up = lw.gate_up(lw.post_norm(hidden))  # [T, 2 I]
            act = silu_mul(gate_up, inter)  # [T, I]
            lw.down_add(act, hidden)
        return self.final_norm(hidden)
