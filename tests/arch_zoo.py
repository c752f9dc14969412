"""Tiny random models of many decoder architectures, built from their
transformers configs (nothing is downloaded).

``tiny_config(arch)`` fills one shared set of small sizes into whichever of
the config's own parameter names it has (``hidden_size`` or ``n_embd``,
``num_hidden_layers`` or ``n_layer``, ...), so an architecture enters the
matrix by its name alone; ``OVERRIDES`` holds the few settings some need on
top (a partial rotary fraction to exercise, a window wider than the longest
sequence). Weights are drawn N(0, 0.2) by the model's own initialiser
(``initializer_range``) so greedy text varies instead of repeating one token.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from tiny_models import random_prompts

MAX_POSITIONS = 256
SIZES = dict(
    vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=MAX_POSITIONS, initializer_range=0.2,
    pad_token_id=0, bos_token_id=1, eos_token_id=0, tie_word_embeddings=False,
    moe_intermediate_size=32, num_experts=4, n_routed_experts=4, num_local_experts=4, num_experts_per_tok=2,
    n_positions=MAX_POSITIONS, n_embd=64, n_layer=2, n_head=4, n_ctx=MAX_POSITIONS,
)

# Decoder-only architectures verified token for token against transformers (the
# architecture matrix runs every one of them); extra config settings per arch.
VERIFIED: dict[str, dict] = {
    "llama": {},
    "qwen2": dict(use_sliding_window=False),
    "qwen3": {},
    "mistral": dict(sliding_window=None, num_key_value_heads=1),  # MQA
    "gemma": {},
    "gemma3_text": dict(sliding_window=4 * MAX_POSITIONS),  # window wider than any sequence: plain causal
    "phi": dict(partial_rotary_factor=0.5),  # partial rotary, fused-free q/k/v with biases
    "phi3": {},  # fused qkv_proj: the query reaches attention as a strided view
    "olmo": {},
    "olmo2": {},
    "granite": {},
    "stablelm": dict(partial_rotary_factor=0.25),
    "gpt_neox": dict(rotary_pct=0.25),  # fused query_key_value + partial rotary
    "gptj": dict(rotary_dim=8),
    "starcoder2": dict(sliding_window=None),
    "gpt2": {},  # learned absolute positions, Conv1D projections
    "cohere": {},
    # beyond the list: MoE, MQA, learned/sinusoidal positions, partial and
    # interleaved rotary, QK norms, NoPE layers, quantised linears
    "mixtral": {}, "qwen2_moe": {}, "qwen3_moe": {}, "olmoe": {}, "granitemoe": {}, "jetmoe": {},
    "gpt_bigcode": {}, "opt": {}, "biogpt": {}, "ctrl": {}, "glm": {}, "glm4": {}, "persimmon": {},
    "nemotron": {}, "cohere2": dict(sliding_window=4 * MAX_POSITIONS), "helium": {}, "internlm3": {},
    "exaone": {}, "bitnet": {}, "llama4_text": {}, "seed_oss": {}, "smollm3": {},
}

# Architectures whose support depends on the transformers release: falcon routes
# attention through AttentionInterface from transformers 5.25 on (refused by
# name before). Each must either match transformers or be refused by name.
EITHER: dict[str, tuple[dict, str]] = {
    "falcon": (dict(alibi=False, new_decoder_architecture=True, num_kv_heads=2), "AttentionInterface"),
}

# Refusal cases: name -> (architecture, config settings that switch the feature
# on, words the refusal must contain). Each is a real config with the feature.
REFUSED: dict[str, tuple[str, dict, str]] = {
    "gemma2-softcap": ("gemma2", dict(attn_logit_softcapping=50.0, sliding_window=4 * MAX_POSITIONS),
                       "soft-capping"),
    "mistral-window": ("mistral", dict(sliding_window=32), "sliding-window attention"),
    "gpt_oss-sinks": ("gpt_oss", dict(sliding_window=4 * MAX_POSITIONS, layer_types=["full_attention"] * 2),
                      "attention sinks"),
    "bert-bidirectional": ("bert", dict(is_decoder=False), "non-causal (bidirectional) attention"),
    "mamba-state-space": ("mamba", {}, "not softmax attention (state-space"),
    "jamba-hybrid": ("jamba", dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                                   expert_layer_offset=1, use_mamba_kernels=False), "not softmax attention"),
    "t5-encoder-decoder": ("t5", {}, "not a decoder-only causal LM"),
    "falcon-alibi": ("falcon", dict(alibi=True), "ALiBi"),
    "bloom-own-attention": ("bloom", {}, "AttentionInterface"),
    "doge-dynamic-mask": ("doge", {}, "mask or bias the model builds itself"),
    "diffllama-differential": ("diffllama", {}, "more than once per forward"),
    "lfm2-conv-hybrid": ("lfm2", dict(layer_types=["conv", "full_attention"]), "layers of type 'conv'"),
    "llama4-chunked": ("llama4_text", dict(attention_chunk_size=32), "chunked attention"),
    "gemma3-window-layers": ("gemma3_text", dict(sliding_window=16), "sliding-window attention"),
}


def tiny_config(arch: str, **overrides):
    """The config class of ``arch`` with the shared tiny sizes and ``overrides``."""
    cls = CONFIG_MAPPING[arch]
    params = inspect.signature(cls.__init__).parameters
    known = set(params) | set(getattr(cls, "attribute_map", {}) or {})
    kwargs = {k: v for k, v in {**SIZES, **overrides}.items() if k in known or k in overrides}
    return cls(**kwargs)


def build_arch_model(arch: str, out_dir: Path, tokenizer_dir: Path, *, seed: int = 0,
                     overrides: dict | None = None) -> Path:
    torch.manual_seed(seed)
    config = tiny_config(arch, **(VERIFIED.get(arch, {}) if overrides is None else overrides))
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except ValueError:  # not a causal LM (an encoder-decoder refusal case): its own class
        model = AutoModel.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    PreTrainedTokenizerFast.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
    return Path(out_dir)


def noisy_copy(model_dir: Path, out_dir: Path, *, rel_std: float = 0.03, seed: int = 1234) -> Path:
    """The model's own weights plus Gaussian noise (``rel_std`` of each tensor's
    std): a draft that agrees with its target only partly."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() > 1:
                param.add_(torch.randn(param.shape, generator=gen) * rel_std * param.std())
    model.save_pretrained(out_dir)
    PreTrainedTokenizerFast.from_pretrained(model_dir).save_pretrained(out_dir)
    return Path(out_dir)


def matrix_prompts() -> list[list[int]]:
    """1 token, below / at / above a block of 4, one chunked several times over,
    and one repeating a 6-token pattern (so an n-gram proposer finds matches)."""
    pattern = random_prompts([6], seed=9)[0]
    return random_prompts([1, 3, 4, 5, 17, 61], seed=1) + [pattern * 4]
