"""The fast decoder's weights: merged q/k/v and gate/up projections, built once
from the loaded model's own modules, sharing their storage.

Where the runner already packed the linears for oneDNN and merged the sibling
projections (``linear_backend.py``, ``merged_linears.py``), the fast decoder
calls the very same merged ``PackedLinear`` the reference path slices, so both
paths run identical GEMMs. Where the projections are plain ``nn.Linear``
(GPU, float16, float64, ``model.linear_backend = "default"``), their weights
are concatenated once and the modules' parameters become views into the
concatenation: no second copy, and the reference path still reads them.
Norms are the modules' own forwards (the fused ``F.rms_norm`` form where
``fused_norms.py`` proved it exact).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from speculant.model.linear.merged import MergedSlice
from speculant.model.linear.packed import PackedLinear
from speculant.model.linear.quantized import QuantLinear

Linear = Callable[[torch.Tensor], torch.Tensor]  # [T, in] -> [T, out]
AddLinear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # ([T, in], residual [T, out]) -> residual


@dataclass(frozen=True, slots=True)
class LayerWeights:
    input_norm: Linear  # [T, H] -> [T, H]
    qkv: Linear  # [T, H] -> [T, (H_q + 2 H_kv) * D]
    o_add: AddLinear  # residual [T, H] += o([T, H_q * D])
    post_norm: Linear
    gate_up: Linear  # [T, H] -> [T, 2 I]
    down_add: AddLinear  # residual [T, H] += down([T, I])


class WeightsError(ValueError):
    """The model's projections cannot be merged as the fast decoder needs."""


def linear_call(module: nn.Module) -> Linear:
    """The cheapest exact call of one projection module (no ``nn.Module.__call__``)."""
    if isinstance(module, PackedLinear):
        return module.fast_call()
    if type(module) is nn.Linear:
        return functools.partial(F.linear, weight=module.weight, bias=module.bias)
    if isinstance(module, QuantLinear):
        return module.forward
    raise WeightsError(f"projection {type(module).__name__} is neither nn.Linear nor a packed linear")


def add_call(module: nn.Module) -> AddLinear:
    """``residual.add_(module(x))`` in its cheapest exact form (fused into the
    kernel where the packed kind has that)."""
    if isinstance(module, PackedLinear):
        return module.add_into
    call = linear_call(module)
    return lambda x, residual: residual.add_(call(x))


def merged_call(modules: list[nn.Module]) -> Linear:
    """One call computing the concatenated outputs of sibling projections that read one input."""
    if all(isinstance(m, MergedSlice) for m in modules):
        slices: list[Any] = modules
        shared = {id(m._shared) for m in slices}
        if len(shared) != 1 or [m.index for m in slices] != list(range(len(slices))):
            raise WeightsError("sibling projections are sliced from different merged GEMMs")
        return slices[0]._shared.merged.fast_call()
    if all(type(m) is nn.Linear for m in modules):
        return _concatenate([m for m in modules if isinstance(m, nn.Linear)])
    if all(isinstance(m, QuantLinear) for m in modules):
        return QuantLinear.siblings_call([m for m in modules if isinstance(m, QuantLinear)])
    kinds = sorted({type(m).__name__ for m in modules})
    raise WeightsError(f"sibling projections of kinds {kinds} were not merged (the packed-linear "
                       "merge declined them), so one GEMM cannot compute them")


def _concatenate(linears: list[nn.Linear]) -> Linear:
    """Concatenate plain linears' weights once; their parameters become views of it."""
    if len({m.bias is None for m in linears}) != 1:
        raise WeightsError("sibling projections disagree on having a bias")
    with torch.no_grad():
        weight = torch.cat([m.weight for m in linears])  # [sum(out), in]
        bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
        offset = 0
        for m in linears:
            rows = m.out_features
            m.weight = nn.Parameter(weight[offset:offset + rows], requires_grad=False)
            if bias is not None:
                m.bias = nn.Parameter(bias[offset:offset + rows], requires_grad=False)
            offset += rows
    return functools.partial(F.linear, weight=weight, bias=bias)


def norm_call(module: nn.Module) -> Linear:
    """The norm's own forward, bound (fused where ``fuse_rms_norms`` made it so)."""
    return module.forward


def layer_weights(layer: Any) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    return LayerWeights(
        input_norm=norm_call(layer.input_layernorm),
        qkv=merged_call([attn.q_proj, attn.k_proj, attn.v_proj]),
        o_add=add_call(attn.o_proj),
        post_norm=norm_call(layer.post_attention_layernorm),
        gate_up=merged_call([mlp.gate_proj, mlp.up_proj]),
        down_add=add_call(mlp.down_proj),
    )
