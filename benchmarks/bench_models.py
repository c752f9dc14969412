"""The random benchmark models and their prompts (options, timing, rounds and
result files are ``harness.py``'s).

The benchmark model is a random-weight Llama built locally (nothing is
downloaded) and cached as a Hugging Face directory:

* ``bench`` (default): hidden 768, 12 layers, 12 attention heads and 12 KV
  heads (no GQA), MLP 2048, vocabulary 32000, 2048 positions, untied input
  embedding and LM head. 134.1M parameters; a decode step reads the 109.6M
  of them that sit in linear layers (the embedding table is only indexed).
* ``quick``: hidden 256, 4 layers, 4 heads, MLP 688, vocabulary 32000 -- for
  smoke tests (``--quick``).
* ``spec-target`` / ``spec-draft`` (``bench_speculative.py``): the ``bench``
  target with 4,096 positions, so a 2,000-token prompt plus decodes fits, and a
  ~9.8M draft (hidden 256, 2 layers, tied embeddings) carrying the target's
  tokenizer files byte for byte; ``spec-quick-*`` are their smoke-test sizes.

The tokenizer is a byte-level BPE trained with ``tokenizers`` on Python
standard-library source (as in ``tests/tiny_models.py``); it has ~20.9k
tokens, below the model's 32000 rows. Weights are random with init std 0.05
instead of HF's default 0.02: with 0.02 greedy text collapses into one
repeated token, which would flatter n-gram speculation and hide exactness
bugs; at 0.05 the 48 tokens of a greedy continuation are all distinct.
The text is meaningless either way; timings are what matter here.

Nothing here imports ``speculant`` at module level: the HF baselines and the
model builder must work whatever state the engine is in.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_CACHE_DIR = Path(os.environ.get("SPECULANT_BENCH_CACHE", "/tmp/speculant-bench-cache"))

EOS = "<|eos|>"
BOS = "<|bos|>"
TOKENIZER_VOCAB = 32000
BUILD_VERSION = 1  # bump to invalidate cached models when the builder changes

# Standard-library modules whose source trains the tokenizer and feeds the prompts.
# Fixed list, fixed order: the same Python version gives the same prompts.
CORPUS_MODULES = (
    "collections", "json.decoder", "json.encoder", "textwrap", "argparse", "dataclasses",
    "functools", "inspect", "typing", "pathlib", "logging", "enum", "string", "difflib",
    "email.message", "http.client", "urllib.parse", "csv", "configparser", "tarfile",
    "zipfile", "pickle", "ast", "tokenize", "unittest.case", "asyncio.base_events",
    "shutil", "subprocess", "random", "statistics", "calendar", "decimal",
)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 32000
    max_positions: int = 2048
    tie_embeddings: bool = False
    init_std: float = 0.05
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps({**asdict(self), "v": BUILD_VERSION}, sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha1(blob).hexdigest()[:10]}"


MODEL_SPECS = {
    "bench": ModelSpec("bench", hidden=768, layers=12, heads=12, kv_heads=12, intermediate=2048),
    "quick": ModelSpec("quick", hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688),
    # the speculative benchmark's pair: ~134M (untied 32000-vocab embeddings and head, the
    # issue's "134M target") and ~9.8M (tied embeddings: the 32000 x 256 table is most of it)
    "spec-target": ModelSpec("spec-target", hidden=768, layers=12, heads=12, kv_heads=12, intermediate=2048,
                             max_positions=4096),
    "spec-draft": ModelSpec("spec-draft", hidden=256, layers=2, heads=4, kv_heads=4, intermediate=688,
                            max_positions=4096, tie_embeddings=True, seed=1),
    "spec-quick-target": ModelSpec("spec-quick-target", hidden=256, layers=4, heads=4, kv_heads=4,
                                   intermediate=688, max_positions=4096),
    "spec-quick-draft": ModelSpec("spec-quick-draft", hidden=64, layers=1, heads=2, kv_heads=2,
                                  intermediate=172, max_positions=4096, tie_embeddings=True, seed=1),
}


# --- corpus, tokenizer, model --------------------------------------------------
def corpus_texts() -> list[str]:
    import importlib
    import inspect

    texts = []
    for name in CORPUS_MODULES:
        try:
            texts.append(inspect.getsource(importlib.import_module(name)))
        except (ImportError, OSError, TypeError):  # a stripped stdlib: use what exists
            continue
    if not texts:
        raise RuntimeError("no standard-library source found to train the benchmark tokenizer on")
    return texts


def build_tokenizer(out_dir: Path):
    from speculant.plugin_api.testing.tiny_model import build_tokenizer as train

    return train(out_dir, corpus_texts(), TOKENIZER_VOCAB, pad_token=EOS)


def build_model(spec: ModelSpec, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    tok = build_tokenizer(out_dir)
    if len(tok) > spec.vocab:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, more than the model's vocabulary {spec.vocab}")
    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions, tie_word_embeddings=spec.tie_embeddings,
        initializer_range=spec.init_std, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def ensure_model(spec_name: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Build the benchmark model once; later calls return the cached directory."""
    return build_cached(MODEL_SPECS[spec_name], cache_dir)


def build_cached(spec: ModelSpec, cache_dir: Path, tokenizer_from: Path | None = None) -> Path:
    """Build ``spec`` into ``cache_dir`` once (a draft may copy its target's tokenizer)."""
    out = Path(cache_dir) / spec.key()
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    build_model(spec, tmp)
    if tokenizer_from is not None:  # the draft must tokenize exactly like the target
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_from) / name).is_file():
                shutil.copy2(Path(tokenizer_from) / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a half-built model is never seen as cached
    print(f"built benchmark model {spec.key()} in {time.perf_counter() - t0:.1f}s -> {out}", file=sys.stderr)
    return out


def ensure_target_and_draft(quick: bool, cache_dir: Path = DEFAULT_CACHE_DIR) -> tuple[Path, Path]:
    """The speculative benchmark's target and draft (the draft shares the target's tokenizer files)."""
    prefix = "spec-quick-" if quick else "spec-"
    target = build_cached(MODEL_SPECS[prefix + "target"], cache_dir)
    draft = build_cached(MODEL_SPECS[prefix + "draft"], cache_dir, tokenizer_from=target)
    return target, draft


def cached_tokenizer(cache_dir: Path = DEFAULT_CACHE_DIR):
    """The benchmark tokenizer alone (no model), trained once into ``cache_dir``."""
    out = Path(cache_dir) / "detokenize-tokenizer"
    if (out / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(out)
    return build_tokenizer(out)


def model_facts(path: Path) -> dict[str, Any]:
    """Shape, parameter count and the bytes one float32 decode step reads
    (``speculant.bench.bandwidth``: every weight but an untied input embedding,
    of which one row), from the model directory's config on the meta device."""
    from speculant.bench.bandwidth import model_decode_bytes

    cfg = json.loads((Path(path) / "config.json").read_text())
    facts = model_decode_bytes(str(path), torch.float32)
    return {"num_params": facts["num_params"], "num_params_m": round(facts["num_params"] / 1e6, 1),
            "hidden": cfg["hidden_size"], "layers": cfg["num_hidden_layers"], "vocab": cfg["vocab_size"],
            "tied_embeddings": bool(cfg.get("tie_word_embeddings")),
            "weight_bytes_per_decode_step": facts["weight_bytes_per_decode_step"], "path": str(path)}


# --- prompts -------------------------------------------------------------------
def token_prompts(tokenizer, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """One token-id prompt per requested length, cut from random places of the
    corpus (deterministic for a given seed and Python version)."""
    text = "\n".join(corpus_texts())
    rng = random.Random(seed)
    prompts = []
    for n in lengths:
        ids: list[int] = []
        width = 8 * n + 64
        while len(ids) < n:
            start = rng.randrange(0, max(1, len(text) - width))
            ids = tokenizer(text[start:start + width], add_special_tokens=False)["input_ids"]
            width *= 2
        prompts.append(list(ids[:n]))
    return prompts


def mixed_workload(num_requests: int, prompt_range: tuple[int, int], output_range: tuple[int, int],
                   seed: int = 1234) -> list[tuple[int, int]]:
    """(prompt_len, output_len) pairs: prompt lengths log-uniform in
    ``prompt_range``, output lengths uniform in ``output_range``."""
    rng = random.Random(seed)
    lo, hi = prompt_range
    pairs = []
    for _ in range(num_requests):
        p = int(round(lo * (hi / lo) ** rng.random()))
        pairs.append((min(max(p, lo), hi), rng.randint(*output_range)))
    return pairs
