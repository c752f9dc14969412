"""Named model sizes (Llama architecture) and the config builder.

Head dim is 64 (32 for "tiny"); most sizes use grouped-query attention; tied
input/output embeddings keep the vocab-4096 head cheap on disk. ``lr`` is the
peak learning rate (t6m: 2e-3 was best of 1e-3/2e-3/5e-3 in a 500k-token test;
the others are scaled down with width). Throughput per size: models/README.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    lr: float

    def params(self, vocab: int, tied: bool = True) -> int:
        head_dim = self.hidden // self.heads
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden
        emb = vocab * self.hidden * (1 if tied else 2)
        return self.layers * (attn + mlp + norms) + self.hidden + emb


TARGET_SIZES: dict[str, Size] = {
    "tiny":   Size(hidden=64,  layers=2,  heads=2,  kv_heads=1, intermediate=192,  lr=3e-3),   # smoke tests
    "t6m":    Size(hidden=256, layers=6,  heads=4,  kv_heads=2, intermediate=768,  lr=2e-3),
    "t12m":   Size(hidden=384, layers=6,  heads=6,  kv_heads=3, intermediate=1024, lr=1.5e-3),
    "t20m":   Size(hidden=448, layers=8,  heads=7,  kv_heads=7, intermediate=1216, lr=1.2e-3),
    "t30m":   Size(hidden=512, layers=10, heads=8,  kv_heads=4, intermediate=1408, lr=1e-3),
}
DRAFT_SIZES: dict[str, Size] = {
    "tiny":   Size(hidden=64,  layers=1,  heads=2,  kv_heads=1, intermediate=192,  lr=3e-3),
    "d1m":    Size(hidden=128, layers=2,  heads=2,  kv_heads=1, intermediate=384,  lr=3e-3),
    "d2m":    Size(hidden=192, layers=2,  heads=3,  kv_heads=3, intermediate=576,  lr=3e-3),
    "d3m":    Size(hidden=256, layers=2,  heads=4,  kv_heads=2, intermediate=768,  lr=2.5e-3),
}


def llama_config(size: Size, vocab_size: int, eos_id: int, max_positions: int):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
        head_dim=size.hidden // size.heads, max_position_embeddings=max_positions, rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id, use_cache=True,
    )


def describe(sizes: dict[str, Size], vocab: int) -> dict[str, dict]:
    return {name: {**asdict(s), "params": s.params(vocab)} for name, s in sizes.items()}
