"""Shared pieces of the benchmark scripts: the benchmark model, prompts, timing,
bandwidth and result files.

The benchmark model is a random-weight Llama built locally (nothing is
downloaded) and cached as a Hugging Face directory:

* ``bench`` (default): hidden 768, 12 layers, 12 attention heads and 12 KV
  heads (no GQA), MLP 2048, vocabulary 32000, 2048 positions, untied input
  embedding and LM head. 134.1M parameters; a decode step reads the 109.6M
  of them that sit in linear layers (the embedding table is only indexed).
* ``quick``: hidden 256, 4 layers, 4 heads, MLP 688, vocabulary 32000 -- for
  smoke tests (``--quick``).

The tokenizer is a byte-level BPE trained with ``tokenizers`` on Python
standard-library source (as in ``tests/tiny_models.py``); it has ~20.9k
tokens, below the model's 32000 rows. Weights are random with init std 0.05
instead of HF's default 0.02: with 0.02 greedy text collapses into one
repeated token, which would flatter n-gram speculation and hide exactness
bugs; at 0.05 the 48 tokens of a greedy continuation are all distinct.
The text is meaningless either way; timings are what matter here.

Nothing here imports ``speculant``: the HF baselines and the model builder
must work whatever state the engine is in.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_CACHE_DIR = Path(os.environ.get("SPECULANT_BENCH_CACHE", "/tmp/speculant-bench-cache"))
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=[EOS, BOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=BOS, pad_token=EOS)
    fast.save_pretrained(out_dir)
    return fast


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


def model_facts(model: torch.nn.Module) -> dict[str, Any]:
    """Parameter counts and the bytes one decode step must read from memory
    (``speculant.bench.bandwidth.decode_weight_bytes``)."""
    from speculant.bench.bandwidth import decode_weight_bytes

    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"num_params": total, "num_params_m": round(total / 1e6, 1),
            "weight_bytes_per_decode_step": decode_weight_bytes(model),
            "tied_embeddings": emb is head or emb.data_ptr() == head.data_ptr()}


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


# --- timing --------------------------------------------------------------------
CLOCKS = ("wall", "cpu")
"""Every timing is taken on two clocks. ``wall``: elapsed time, what a user
waits. ``cpu``: CPU time of the whole process (all its threads). With one
torch thread on a machine shared with other jobs, ``cpu`` leaves out the time
the process sat descheduled, so it is the steadier figure there; with several
threads it also counts OpenMP threads spinning at barriers."""


def stamp() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(t0: tuple[float, float]) -> tuple[float, float]:
    """(wall, cpu) seconds since ``t0 = stamp()``."""
    w, c = stamp()
    return w - t0[0], c - t0[1]


def time_calls(fn: Callable[[], Any], repeat: int, warmup: int = 1) -> list[float]:
    """Seconds per call for ``repeat`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def summary(samples: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples), "samples": [round(s, 6) for s in samples]}


def measure_read_bandwidth(num_bytes: int = 1 << 30, repeat: int = 7) -> dict[str, float]:
    """Read bandwidth in GB/s with one thread and with every core (the bound is
    about the hardware, not the thread count a benchmark picked):
    ``speculant.bench.bandwidth.read_bandwidth``."""
    from speculant.bench.bandwidth import read_bandwidth

    return read_bandwidth(num_bytes, repeat)


# --- environment and results ---------------------------------------------------
def cpu_name() -> str:
    from speculant.bench.report import cpu_name as name

    return name()


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict[str, Any]:
    import transformers

    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "os_cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "git_commit": git_commit(),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def base_arg_parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: tiny model and sizes, under a minute; results not comparable")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                    help=f"where the benchmark model is built once (default {DEFAULT_CACHE_DIR})")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--out", type=Path, default=None, help="JSON result path")
    return ap


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
