"""Layer by layer, what a decoder layer computes on given inputs, three ways.

The load-time self-test (``seam_selftest.py``) asks whether the engine's path
through a layer is as close to the truth as transformers' own. Comparing the two
low-precision paths with each other cannot tell: over 28 bfloat16 layers two
correct paths drift apart (Qwen2.5-1.5B: 0.116 of the logits' scale), and the
more accurate one is refused as readily as a wrong one. So every layer is run
on the same input through

* transformers' ``eager`` attention, in the model's dtype (``capture``),
* the engine's seam, in the model's dtype (``substitute``: the engine's
  forward, with each layer's input replaced by the eager path's), and
* a reference: the same layer upcast to float32 (float64 for a float32 model),
  one layer at a time (``upcast_layer``), so memory stays near the model's size,

and each path's error is measured against the reference (``token_error``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from speculant.model.linear.packed import PackedLinear

Call = tuple[tuple[Any, ...], dict[str, Any]]  # a layer call's (args, kwargs)


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The model's decoder layers: the module list as long as ``num_hidden_layers``; None if none is."""
    config: Any = model.config
    n = getattr(config.get_text_config(), "num_hidden_layers", None)
    return next((m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == n), None)


def hidden_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """The hidden states a layer is called with: ``[1, T, H]``."""
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def with_hidden(args: tuple[Any, ...], kwargs: dict[str, Any], hidden: torch.Tensor) -> Call:
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": hidden}
    return (hidden, *args[1:]), kwargs


def output_of(out: Any) -> torch.Tensor:
    """A layer's output hidden states (some layers return a tuple)."""
    return out[0] if isinstance(out, tuple) else out


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, tuple):
        return tuple(_cast(v, dtype) for v in value)
    return value


@contextlib.contextmanager
def hooked(layers: nn.ModuleList, pre: Callable[..., Any] | None, post: Callable[..., Any] | None) -> Iterator[None]:
    """Forward pre- and post-hooks (with kwargs) on every layer; ``pre(i, args, kwargs)`` and
    ``post(i, args, kwargs, out)`` get the layer's index."""
    handles = []
    for i, layer in enumerate(layers):
        if pre is not None:
            handles.append(layer.register_forward_pre_hook(
                lambda m, a, k, i=i: pre(i, a, k), with_kwargs=True))
        if post is not None:
            handles.append(layer.register_forward_hook(
                lambda m, a, k, o, i=i: post(i, a, k, o), with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _plain_linear(module: nn.Module, dtype: torch.dtype) -> nn.Linear:
    """A dense ``nn.Linear`` in ``dtype`` computing what a packed (or merged-slice) linear computes."""
    weight: torch.Tensor = module.weight  # type: ignore[assignment]  # [out, in], a dense copy
    bias: torch.Tensor | None = getattr(module, "bias", None)
    shared = getattr(module, "_shared", None)
    if shared is not None and shared.merged.bias is not None:  # a slice of a merged GEMM
        index: int = module.index  # type: ignore[assignment]
        start = sum(shared.sizes[:index])
        bias = shared.merged.bias[start:start + weight.shape[0]]
    plain = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=dtype)
    with torch.no_grad():
        plain.weight.copy_(weight)
        if bias is not None:
            plain.bias.copy_(bias)
    return plain


@contextlib.contextmanager
def upcast_layer(layer: nn.Module, dtype: torch.dtype) -> Iterator[nn.Module]:
    """``layer`` itself, computing in ``dtype`` with plain torch modules: packed linears swapped
    for dense ones, fused norms back on their class's forward, every parameter and buffer cast.
    Everything is put back afterwards, bit for bit (the casts round-trip exactly)."""
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in list(layer.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear) or hasattr(child, "_shared"):
                swapped.append((parent, name, child))
                setattr(parent, name, _plain_linear(child, dtype))
    forwards = [(m, m.__dict__.pop("forward")) for m in layer.modules() if "forward" in m.__dict__]
    tensors = [t for t in (*layer.parameters(), *layer.buffers()) if t.is_floating_point()]
    dtypes = [t.dtype for t in tensors]
    for t in tensors:
        t.data = t.data.to(dtype)
    try:
        yield layer
    finally:
        for t, dt in zip(tensors, dtypes):
            t.data = t.data.to(dt)
        for m, fwd in forwards:
            m.forward = fwd
        for parent, name, child in swapped:
            setattr(parent, name, child)


def reference_outputs(layer: nn.Module, calls: list[Call], dtype: torch.dtype) -> list[torch.Tensor]:
    """``layer`` upcast to ``dtype``, run on each recorded call (inputs cast up too). A layer with
    an operator that has no float64 kernel (mixture-of-experts' grouped matmul) runs in float32."""
    try:
        with upcast_layer(layer, dtype) as up:
            return [output_of(up(*_cast(a, dtype), **_cast(k, dtype))) for a, k in calls]
    except RuntimeError:
        if dtype != torch.float64:
            raise
        return reference_outputs(layer, calls, torch.float32)


def token_errors(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Each token's relative L2 error, ``|got_t - ref_t| / |ref_t|``: ``[T]`` float64 for ``[..., T, H]``.
    Per token, so one wrong token (a decode) is not averaged away among right ones."""
    got, ref = got.reshape(-1, got.shape[-1]).double(), ref.reshape(-1, ref.shape[-1]).double()
    return (got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)


def token_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest of ``token_errors`` (0 for no tokens)."""
    err = token_errors(got, ref)
    return float(err.max()) if err.numel() else 0.0
