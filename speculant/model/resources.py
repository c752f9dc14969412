"""Checks of a valid config against the model files and this machine, for
``speculant config check``: settings that pass the schema but would fail at
engine build with a raw error (an allocator failure, a CUDA error, a
``SafetensorError``) are reported here as problems naming the option, the
value, the reason and the fix.

* ``model.device = 'cuda'`` when torch sees no CUDA device;
* ``model.max_model_len`` beyond the model's ``max_position_embeddings``;
* the model's ``*.safetensors`` headers (truncated or corrupt files);
* the KV pool (``cache.num_blocks`` x bytes per block, or ``cache.memory_gb``)
  larger than the device's memory (total RAM on the CPU). Bytes per block are
  estimated from ``config.json`` as 2 (K and V) x layers x KV heads x head dim
  x dtype bytes x block size.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from speculant.config.models import EngineConfig, resolve_device

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def text_config(model_dir: str) -> dict | None:
    """The (text) config.json of ``model_dir``; None if it cannot be read."""
    try:
        data = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    inner = data.get("text_config")
    return inner if isinstance(inner, dict) else data


def _positive_int(cfg: dict, *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if type(value) is int and value > 0:
            return value
    return None


def kv_block_shape(cfg: dict) -> tuple[int, int, int] | None:
    """(layers, KV heads, head dim) from a config.json; None if it does not say."""
    layers = _positive_int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _positive_int(cfg, "num_attention_heads", "n_head")
    kv_heads = _positive_int(cfg, "num_key_value_heads", "num_kv_heads") or heads
    hidden = _positive_int(cfg, "hidden_size", "n_embd")
    head_dim = _positive_int(cfg, "head_dim") or (hidden // heads if hidden and heads else None)
    if not (layers and kv_heads and head_dim):
        return None
    return layers, kv_heads, head_dim


def total_memory_bytes(device: str) -> int | None:
    """Total memory of ``device`` ('cpu': RAM from /proc/meminfo or sysconf;
    'cuda': the first GPU); None if unknown."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def device_problems(config: EngineConfig) -> list[str]:
    if config.model.device != "cuda":
        return []
    import torch

    if torch.cuda.is_available():
        return []
    return ["model.device = 'cuda': torch sees no CUDA device here (torch.cuda.is_available() is False, "
            f"torch {torch.__version__}); set model.device = 'cpu' or 'auto', or install a CUDA build of torch"]


def memory_problems(config: EngineConfig, cfg: dict, device: str) -> list[str]:
    shape, total = kv_block_shape(cfg), total_memory_bytes(device)
    if shape is None or total is None:
        return []
    layers, kv_heads, head_dim = shape
    cache, dtype = config.cache, config.model.dtype
    per_block = 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype] * cache.block_size
    where = "RAM" if device == "cpu" else f"{device} memory"
    if cache.num_blocks is not None:
        need: float = cache.num_blocks * per_block
        value = f"cache.num_blocks = {cache.num_blocks}"
        how = (f"{cache.num_blocks} blocks x {per_block} bytes (2 x {layers} layers x {kv_heads} KV heads x "
               f"{head_dim} head dim x {DTYPE_BYTES[dtype]} bytes ({dtype}) x {cache.block_size} tokens)")
        fix = f"lower cache.num_blocks (at most {total // per_block} blocks fit in all of it)"
    else:
        need = cache.memory_gb * (1 << 30)
        value, how = f"cache.memory_gb = {cache.memory_gb}", f"{cache.memory_gb} GiB"
        fix = f"lower cache.memory_gb below {total / (1 << 30):.2f}"
    if need <= total:
        return []
    return [f"{value}: the KV cache needs {how} = {_gib(need)}, more than the {_gib(total)} of {where} on this "
            f"machine; {fix}"]


def resource_problems(config: EngineConfig) -> list[str]:
    """Every problem of ``config`` against the model files and this machine
    (empty when none; model checks are skipped when model.path is not a model
    directory, which the engine reports itself)."""
    from speculant.model.loading.files import ModelFileError, check_weight_files

    problems = device_problems(config)
    cfg = text_config(config.model.path)
    if cfg is None:
        return problems
    limit = _positive_int(cfg, *_POSITION_KEYS)
    want = config.model.max_model_len
    if want is not None and limit is not None and want > limit:
        problems.append(f"model.max_model_len = {want} exceeds the {limit} positions of the model in "
                        f"{config.model.path!r} (config.json); set it to at most {limit} or leave it unset")
    try:
        check_weight_files(config.model.path)
    except (ModelFileError, OSError) as exc:
        problems.append(str(exc))
    device = resolve_device(config.model.device).type
    return problems + memory_problems(config, cfg, device)  # no CUDA: memory unknown, skipped
