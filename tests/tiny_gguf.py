"""Write tiny llama GGUF checkpoints for the GGUF-source tests.

A random ``LlamaForCausalLM`` (GQA, 2 layers) is written the way llama.cpp
lays a llama out: tensor names from gguf-py's name map, q/k rows permuted into
llama.cpp's rotary layout (transformers undoes this on load), the 2-D linear
weights quantized to Q8_0, and a byte-level BPE ("gpt2") tokenizer taken from
the test tokenizer (tokens, merges, token types, BOS/EOS, a chat template).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

CHAT_TEMPLATE = "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
Q8_ROW_MULTIPLE = 32  # Q8_0 blocks hold 32 values


def rotary_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a q or k projection, per head, from transformers' half-split rotary
    order to llama.cpp's interleaved order (the inverse of what transformers'
    ``LlamaTensorProcessor`` applies when it reads the file)."""
    rows = weight.shape[0]
    half = rows // n_heads // 2
    return weight.reshape(n_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def tiny_llama(tokenizer_dir: Path, seed: int = 0, layers: int = 2, hidden: int = 64):
    torch.manual_seed(seed)
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         tie_word_embeddings=False, initializer_range=0.3)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), tok


def quantize_as(data: np.ndarray, type_name: str) -> np.ndarray:
    """``data`` [n, k] as blocks of ``type_name``: our K-quant quantizers, else gguf-py's."""
    import gguf
    from k_quantize import quantize_q4_k, quantize_q6_k

    own = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}
    if type_name in own:
        return own[type_name](data)
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType[type_name])


def _tokenizer_metadata(writer, tok: PreTrainedTokenizerFast) -> None:
    state = json.loads(tok.backend_tokenizer.to_str())["model"]
    vocab = state["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    special = {tok.bos_token, tok.eos_token}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3 = CONTROL, 1 = NORMAL
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_tiny_gguf(path: Path, tokenizer_dir: Path, *, seed: int = 0, quantize: bool = True,
                    architecture: str = "llama", raw_tensor: tuple | None = None, hidden: int = 64,
                    types: dict[str, str] | None = None) -> Path:
    """Write the tiny llama to ``path``. ``architecture`` overrides the declared
    architecture; ``raw_tensor = (name, ggml_type)`` replaces that 2-D tensor by
    zero blocks of ``ggml_type`` (to write a type gguf-py cannot dequantize).
    ``types`` maps a tensor's role (``attn_q``, ``ffn_down``, ``token_embd`` ...) to
    the block format to store it in (``Q4_K``, ``Q6_K``, or any gguf-py quantizes),
    instead of Q8_0 for the block linears."""
    import gguf

    model, tok = tiny_llama(tokenizer_dir, seed, hidden=hidden)
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    _tokenizer_metadata(writer, tok)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        base, suffix = hf_name.rsplit(".", 1)
        name = f"{names.get_name(base)}.{suffix}"
        data = tensor.numpy().astype(np.float32)
        if ".attn_q." in name:
            data = rotary_permute(data, cfg.num_attention_heads)
        elif ".attn_k." in name:
            data = rotary_permute(data, cfg.num_key_value_heads)
        role = name.split(".")[-2]
        if types is not None and data.ndim == 2 and role in types:
            q = quantize_as(data, types[role])
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType[types[role]])
        elif raw_tensor is not None and name == raw_tensor[0]:
            block, size = gguf.GGML_QUANT_SIZES[raw_tensor[1]]
            blocks = np.zeros((data.shape[0], data.shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=raw_tensor[1])
        elif quantize and data.ndim == 2 and name.startswith("blk.") and data.shape[1] % Q8_ROW_MULTIPLE == 0:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
