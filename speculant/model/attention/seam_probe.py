"""What a model hands its attention function, checked before the engine trusts it.

The paged backends implement one thing: causal softmax attention of a
sequence's queries over its own keys, with a scale, grouped K/V heads and
nothing else. A model can ask for more through the attention function's
arguments (a window, soft-capping, sink logits, its own bias or mask,
bidirectional layers, keys from an encoder) or do without it in some layers
(state-space and hybrid models). Rather than trusting a list of architecture
names, the runner pushes a few tokens through the model once at load with
:func:`probe_attention` and :func:`seam_refusals` turns every call the seam
saw into the features it would get wrong. Anything the seam does not know is
refused by name: an unknown argument with a value is a feature until shown
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from speculant.interfaces import AttentionBackend
from speculant.model.attention.context import ForwardContext, forward_context

# Arguments the seam ignores because they never change the result in eval mode.
HARMLESS_KWARGS = frozenset({
    "dropout", "scaling", "position_ids", "use_cache", "output_attentions", "cache_position",
    "output_router_logits", "past_key_values", "past_key_value", "layer_idx",
})


@dataclass(frozen=True)
class AttentionCall:
    """One call of the attention function during the probe forward."""

    layer: int | None  # module.layer_idx, None when the module has none
    query_shape: tuple[int, ...]  # [1, H, T, D]
    key_shape: tuple[int, ...]  # [1, H_kv, S, D]
    value_shape: tuple[int, ...]  # [1, H_kv, S, D_v]
    is_causal: bool | None  # module.is_causal (None: the module does not say)
    has_mask: bool  # the model built its own mask or bias (our mask interface returns None)
    kwargs: dict[str, Any] = field(default_factory=dict)  # every extra argument, as passed


def describe_call(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, kwargs: dict[str, Any]) -> AttentionCall:
    causal = getattr(module, "is_causal", None)
    return AttentionCall(layer=getattr(module, "layer_idx", None), query_shape=tuple(query.shape),
                         key_shape=tuple(key.shape), value_shape=tuple(value.shape),
                         is_causal=None if causal is None else bool(causal),
                         has_mask=attention_mask is not None, kwargs=dict(kwargs))


@torch.inference_mode()
def probe_attention(model: torch.nn.Module, backend: AttentionBackend, device: torch.device,
                    num_tokens: int = 3) -> list[AttentionCall]:
    """Run ``num_tokens`` tokens through ``model`` recording every attention call
    (the seam attends to nothing and returns zeros while probing)."""
    calls: list[AttentionCall] = []
    ctx = ForwardContext(backend, None, [], [], on_layer=calls.append)
    ids = torch.zeros(1, num_tokens, dtype=torch.long, device=device)
    positions = torch.arange(num_tokens, device=device).unsqueeze(0)
    with forward_context(ctx):
        model(input_ids=ids, position_ids=positions, use_cache=False,
              logits_to_keep=torch.zeros(0, dtype=torch.long, device=device))
    return calls


def _kwarg_problem(name: str, value: Any, max_model_len: int) -> str | None:
    if value is None or name in HARMLESS_KWARGS:
        return None
    if name == "sliding_window":
        if isinstance(value, int) and value >= max_model_len:
            return None  # a window no sequence can outgrow is plain causal attention
        return (f"sliding-window attention (window {value} < max_model_len {max_model_len}); "
                f"set model.max_model_len <= {value} or use a model without a window")
    if name == "softcap":
        return None if value == 0 else f"attention logit soft-capping (softcap={value}); use a model without it"
    if name in ("s_aux", "sinks"):
        return f"attention sinks (learned per-head sink logits, `{name}`); use a model without them"
    if name == "is_causal":
        return None if value is True else "non-causal (bidirectional) attention layers"
    if name == "encoder_hidden_states":
        return "cross-attention to encoder states (encoder-decoder model); use a decoder-only model"
    kind = type(value).__name__
    return (f"an attention argument speculant does not implement (`{name}` = {kind}); "
            "use the `torch` path of transformers for this model")


def seam_refusals(calls: list[AttentionCall], num_layers: int | None, max_model_len: int) -> list[str]:
    """Every feature the probe's calls show that the paged backends would get wrong."""
    if not calls:
        return ["no layer called transformers' attention interface: a state-space or recurrent model, "
                "or one that computes attention in its own code; speculant needs softmax attention "
                "routed through AttentionInterface in every layer"]
    problems: list[str] = []

    def add(problem: str) -> None:
        if problem not in problems:
            problems.append(problem)

    layers = [c.layer for c in calls if c.layer is not None]
    if len(layers) != len(calls):
        add("attention modules without a `layer_idx`, so their KV cache cannot be placed")
    elif len(layers) != len(set(layers)):
        add(f"layers that call attention more than once per forward (layer indices {sorted(layers)}: "
            "differential or multi-stream attention)")
    elif num_layers is not None and len(layers) < num_layers:
        add(f"state-space, convolution or other non-attention layers ({num_layers - len(layers)} of "
            f"{num_layers} layers never call attention: a hybrid model)")
    elif sorted(layers) != list(range(len(layers))):
        add(f"attention layers reported indices {sorted(layers)}, not 0..L-1")
    for c in calls:
        if c.is_causal is False:
            add("non-causal (bidirectional) attention layers; speculant generates with causal attention only")
        if c.has_mask:
            add("an attention mask or bias the model builds itself (e.g. ALiBi or a learned/dynamic mask)")
        if c.key_shape[2] != c.query_shape[2]:
            add(f"keys of a different length than the queries ({c.key_shape[2]} vs {c.query_shape[2]}: "
                "cross-attention or compressed keys)")
        if c.value_shape[-1] != c.key_shape[-1]:
            add(f"value head size {c.value_shape[-1]} differs from the key head size {c.key_shape[-1]}")
        if c.query_shape[1] % c.key_shape[1]:
            add(f"{c.query_shape[1]} query heads are not a multiple of {c.key_shape[1]} K/V heads")
        for name, value in c.kwargs.items():
            problem = _kwarg_problem(name, value, max_model_len)
            if problem:
                add(problem)
    return problems
