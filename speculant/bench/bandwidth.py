"""The memory-bandwidth bound of batch-1 decoding, for ``speculant bench``.

A batch-1 decode step of a small dense model is memory-bound: it must read
every linear layer's weights (LM head included) once, and little else. So no
engine can decode faster than ``read bandwidth / weight bytes per step``
tokens per second; a row's decode speed divided by that bound says how much
of the machine it uses.

* ``decode_weight_bytes``: bytes one step reads. Every parameter counts in
  full except an untied input embedding, which is only indexed (one row per
  token). With tied embeddings the LM head *is* the embedding and is read once.
  Computed on the meta device from the model's config: no weights are loaded.
* ``read_bandwidth``: GB/s of ``torch.sum`` over a buffer far larger than the
  caches, with one thread and with every core; the best repeat is what the
  memory system can do (under load from other jobs one thread can beat all
  cores), the median shows how much load took.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch


def decode_weight_bytes(model: Any) -> int:
    """Bytes of parameters one batch-1 decode step of ``model`` (a transformers
    ``PreTrainedModel``) reads."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    head_weight = head.weight if head is not None else None
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p is emb and p is not head_weight:
            total += emb.shape[1] * p.element_size()  # one row is gathered
        else:
            total += p.numel() * p.element_size()
    return total


def model_decode_bytes(model_dir: str, dtype: torch.dtype) -> dict[str, Any]:
    """Parameter count and decode bytes of the model in ``model_dir`` stored as
    ``dtype``, built on the meta device from its config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"num_params": params, "dtype": str(dtype).removeprefix("torch."),
            "weight_bytes_per_decode_step": decode_weight_bytes(model)}


def read_bandwidth(num_bytes: int = 1 << 29, repeat: int = 5) -> dict[str, float]:
    """Read bandwidth in GB/s (best and median repeat) over 1 thread and all cores."""
    threads = torch.get_num_threads()
    x = torch.ones(num_bytes // 4, dtype=torch.float32)
    times: list[float] = []
    try:
        for n in sorted({1, os.cpu_count() or 1}):
            torch.set_num_threads(n)
            x.sum()  # warm-up
            for _ in range(repeat):
                t0 = time.perf_counter()
                x.sum()
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
        del x
    return {"best_gb_s": num_bytes / min(times) / 1e9, "median_gb_s": num_bytes / statistics.median(times) / 1e9}


def bound_tokens_per_s(weight_bytes: int, gb_s: float) -> float:
    """Decode tokens/s if a step took exactly the time to read its weights."""
    return gb_s * 1e9 / weight_bytes
