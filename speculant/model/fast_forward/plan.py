"""Which models the fast decoder runs, as data, and the reasons it declines the rest.

An ``ArchSpec`` names, per ``model_type``, the transformers classes whose
forward the fast decoder reproduces and what may vary inside the family (biases
on q/k/v, tied embeddings, the rotary variants whose inverse frequencies do not
change with the sequence length). ``plan_model`` inspects a loaded model
against its spec — the config and the actual module tree — and returns a
``Plan`` with the sizes the decoder needs, or every reason it cannot run the
model exactly (the reference path, transformers' own modules, runs those).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})
"""Rotary variants whose cos/sin depend on the position alone (a table can hold
them); ``dynamic`` and ``longrope`` rescale with the sequence length."""


@dataclass(frozen=True)
class ArchSpec:
    """One decoder family the fast path implements: embedding, pre-norm layers
    (RMSNorm, attention with rotary q/k, RMSNorm, SiLU-gated MLP), final norm."""

    model_type: str
    causal_lm_class: str
    decoder_layer_class: str
    qkv_bias: bool  # the family may carry biases on q/k/v (all three or none)
    window_always_on: bool = False  # config.sliding_window applies without use_sliding_window / layer_types
    note: str = ""


ARCH_SPECS: dict[str, ArchSpec] = {spec.model_type: spec for spec in (
    ArchSpec("llama", "LlamaForCausalLM", "LlamaDecoderLayer", qkv_bias=True,
             note="attention_bias and mlp_bias, tied or untied embeddings, rope default/linear/llama3/yarn"),
    ArchSpec("mistral", "MistralForCausalLM", "MistralDecoderLayer", qkv_bias=False, window_always_on=True,
             note="a sliding window at least max_model_len (narrower ones are refused at load)"),
    ArchSpec("qwen2", "Qwen2ForCausalLM", "Qwen2DecoderLayer", qkv_bias=True,
             note="q/k/v biases; sliding layers only with a window at least max_model_len"),
)}

LAYER_CHILDREN = frozenset({"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"})
ATTENTION_CHILDREN = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
MLP_CHILDREN = frozenset({"gate_proj", "up_proj", "down_proj", "act_fn"})


@dataclass(frozen=True)
class Plan:
    """What the fast decoder needs to know about one model."""

    spec: ArchSpec
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    scaling: float  # the attention's softmax scale (head_dim ** -0.5 in this family)


def base_of(model: nn.Module) -> Any:
    """The decoder stack (``model.model``) of a ``*ForCausalLM``."""
    base = getattr(model, "model", None)
    return base if isinstance(base, nn.Module) else model


def plan_model(model: Any, max_model_len: int) -> Plan | list[str]:
    """A ``Plan`` when the fast decoder reproduces ``model``; else every reason it does not."""
    cfg = model.config
    spec = ARCH_SPECS.get(getattr(cfg, "model_type", ""))
    if spec is None:
        return [f"architecture {cfg.model_type!r} has no fast decoder (implemented: "
                f"{', '.join(sorted(ARCH_SPECS))})"]
    reasons = _config_reasons(spec, cfg, max_model_len)
    if type(model).__name__ != spec.causal_lm_class:
        reasons.append(f"model class {type(model).__name__} is not {spec.causal_lm_class}")
    reasons.extend(_module_reasons(spec, base_of(model)))
    if reasons:
        return reasons
    attn = base_of(model).layers[0].self_attn
    return Plan(spec=spec, num_layers=len(base_of(model).layers), num_heads=cfg.num_attention_heads,
                num_kv_heads=cfg.num_key_value_heads, head_dim=attn.head_dim,
                intermediate_size=cfg.intermediate_size, scaling=float(attn.scaling))


def _config_reasons(spec: ArchSpec, cfg, max_model_len: int) -> list[str]:
    reasons = []
    if getattr(cfg, "hidden_act", None) != "silu":
        reasons.append(f"activation {getattr(cfg, 'hidden_act', None)!r} (the fast MLP computes silu(gate) * up)")
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in STATIC_ROPE_TYPES:
        reasons.append(f"rope type {rope!r} (the fast path takes cos/sin from a table of positions: "
                       f"{', '.join(sorted(STATIC_ROPE_TYPES))})")
    window = getattr(cfg, "sliding_window", None)
    layer_types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    windowed = ("sliding_attention" in layer_types or spec.window_always_on
                or bool(getattr(cfg, "use_sliding_window", False)))
    if windowed and window is not None and window < max_model_len:
        reasons.append(f"sliding-window attention (sliding_window={window} < max_model_len={max_model_len})")
    if layer_types - {"full_attention", "sliding_attention"}:
        reasons.append(f"layer types {sorted(layer_types)} (the fast path runs softmax attention layers only)")
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        reasons.append(f"pretraining_tp={cfg.pretraining_tp}")
    return reasons


def _module_reasons(spec: ArchSpec, base: Any) -> list[str]:
    """The module tree is what the spec says: nothing extra a config flag could not show."""
    layers = getattr(base, "layers", None)
    needed = ("embed_tokens", "norm", "rotary_emb")
    if not isinstance(layers, nn.ModuleList) or any(not hasattr(base, n) for n in needed):
        return [f"the base model lacks layers / {' / '.join(needed)}"]
    for i, layer in enumerate(layers):
        problem = _layer_problem(spec, layer)
        if problem:
            return [f"layer {i}: {problem}"]
    return []


def _layer_problem(spec: ArchSpec, layer: Any) -> str | None:
    if type(layer).__name__ != spec.decoder_layer_class:
        return f"decoder layer class {type(layer).__name__} is not {spec.decoder_layer_class}"
    extra = {n for n, _ in layer.named_children()} ^ LAYER_CHILDREN
    if extra:
        return f"modules {sorted(extra)} differ from the family's decoder layer"
    attn_extra = {n for n, _ in layer.self_attn.named_children()} ^ ATTENTION_CHILDREN
    if attn_extra:
        return f"attention modules {sorted(attn_extra)} (e.g. q/k norms) differ from the family's"
    mlp_extra = {n for n, _ in layer.mlp.named_children()} ^ MLP_CHILDREN
    if mlp_extra:
        return f"MLP modules {sorted(mlp_extra)} differ from the family's"
    if type(layer.mlp.act_fn).__name__ not in ("SiLUActivation", "SiLU"):
        return f"activation module {type(layer.mlp.act_fn).__name__} is not SiLU"
    biases = {_has_bias(getattr(layer.self_attn, n)) for n in ("q_proj", "k_proj", "v_proj")}
    if len(biases) != 1 or (True in biases and not spec.qkv_bias):
        return "q/k/v biases the family does not have"
    return None


def _has_bias(linear: nn.Module) -> bool:
    return getattr(linear, "bias", None) is not None
