"""``model.quantization = "gguf"``: keep a GGUF checkpoint's quantized tensors in their blocks.

The model is built from the cached Hugging Face conversion (``gguf_source``),
then every linear layer whose GGUF tensor has a block format with a kernel
(``QUANT_FORMATS``) becomes a ``QuantLinear`` over the file's own bytes and its
dense weight is released; the input embedding becomes a ``QuantEmbedding`` on
the same blocks (with tied embeddings the output projection shares them). The
bytes kept are the file's bytes, so the resident weights stay near the file's size.

Layout check: transformers may reorder rows when it converts (llama's q/k rows
go from llama.cpp's interleaved rotary order back to the half-split one). For
each tensor, a few rows dequantized from the blocks are compared with the
converted weight, as they are and in the un-permuted rotary order; the
ordering that matches is applied to the block rows. A tensor none matches, or
of a type without a kernel, stays dequantized, with one notice line for all.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from speculant.model.linear import quantized
from speculant.model.linear.quantized import QUANT_FORMATS, QuantEmbedding, QuantFormat, QuantLinear, stored_blocks
from speculant.model.loading.gguf_tensors import GGUFTensors
from speculant.model.loading.hf_model import load_hf_model
from speculant.model.loading.skeleton import CheckpointTensors, materialise

logger = logging.getLogger(__name__)
QUANTIZATIONS = ("gguf", "dequantize")
SAMPLE_ROWS = 4


@dataclass
class QuantReport:
    """What ``keep_quantized`` did."""

    num_quantized: int = 0
    quantized_bytes: int = 0
    formats: dict[str, int] = field(default_factory=dict)
    """Format name -> layers kept in it."""
    dequantized: dict[str, list[str]] = field(default_factory=dict)
    """Reason -> GGUF tensors left dequantized for it."""
    notice: str | None = None

    def describe(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.formats.items()))
        return (f"{self.num_quantized} linear layers kept quantized ({kinds}; {self.quantized_bytes / 2**20:.0f} MiB)"
                + (f"; {self.notice}" if self.notice else ""))


def check_quantization(value: str, option: str = "model.quantization") -> str:
    if value not in QUANTIZATIONS:
        raise ValueError(f"{option} = {value!r} is not a quantization mode: 'gguf' keeps a GGUF checkpoint's "
                         "quantized tensors in their blocks, 'dequantize' converts every tensor to model.dtype; "
                         "set one of the two")
    return value


def _rotary_order(rows: int, heads: int) -> np.ndarray:
    """Index ``inv`` with ``W_hf = W_gguf[inv]`` for llama.cpp's interleaved q/k rows."""
    idx = np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)
    return np.argsort(idx)


def _row_orders(name: str, rows: int, cfg) -> list[np.ndarray | None]:
    orders: list[np.ndarray | None] = [None]
    heads = {"attn_q": getattr(cfg, "num_attention_heads", None),
             "attn_k": getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", None)}
    for part, n in heads.items():
        if f".{part}." in name and n and rows % (2 * n) == 0:
            orders.append(_rotary_order(rows, n))
    return orders


RowReader = Callable[[str, torch.Tensor, np.ndarray], torch.Tensor]
"""(qualified parameter name, the parameter, row indices) -> those rows of the converted weight, [S, K]."""


def rows_of_parameter(name: str, weight: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """The default ``RowReader``: the rows of the weight the model holds."""
    return weight[torch.from_numpy(rows)]


def _matching_order(blocks: np.ndarray, type_name: str, k: int, name: str, dense: torch.Tensor, read: RowReader,
                    orders: list[np.ndarray | None]) -> tuple[bool, np.ndarray | None]:
    """The row order under which sampled block rows dequantize to ``dense`` ([N, K]), read by ``read``."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    n = dense.shape[0]
    sample = np.unique(np.linspace(0, n - 1, SAMPLE_ROWS).astype(np.int64))
    want = read(name, dense, sample).float().numpy()
    tol = 2.0**-7 * (np.abs(want).max() + 1e-30) if dense.dtype != torch.float32 else 1e-6 * np.abs(want).max()
    for order in orders:
        src = sample if order is None else order[sample]
        got = gguf.quants.dequantize(blocks[src], qtype).reshape(len(src), k)
        if np.abs(got - want).max() <= tol + 1e-12:
            return True, order
    return False, None


def _tensor_name(map_, module_name: str) -> str | None:
    return map_.get_name(module_name)


def keep_quantized(model: Any, source: Path, dtype: torch.dtype, read: RowReader = rows_of_parameter) -> QuantReport:
    """Swap ``model``'s linear layers (and input embedding) for quantized ones over ``source``'s blocks.
    The layout check reads sampled rows of each converted weight through ``read`` (the weights may
    still be on the meta device, ``loading/skeleton.py``); nothing else of a replaced weight is read."""
    import gguf

    report = QuantReport()
    if (why := quantized.quant_kernel_unavailable_reason()) is not None:
        report.notice = f"every tensor stays dequantized: {why}"
        logger.warning("model.quantization = 'gguf': %s", report.notice)
        return report
    reader = GGUFTensors(source)  # not gguf.GGUFReader: it parses the tokenizer arrays too (15 s at 1.5B)
    arch_name = reader.fields["general.architecture"].contents()
    cfg = model.config.get_text_config()
    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch_name)
    if arch is None:
        report.notice = f"architecture {arch_name!r} has no gguf-py name map: every tensor stays dequantized"
        return report
    name_map = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    tensors = {t.name: t for t in reader.tensors}
    shared: dict[str, tuple[torch.Tensor, QuantFormat]] = {}  # GGUF name -> blocks kept, their layout (tied)
    embed = model.get_input_embeddings()
    slots = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    out_emb = model.get_output_embeddings()
    for module_name, module in slots:
        gname = _tensor_name(name_map, module_name)
        if module is out_emb and (gname is None or f"{gname}.weight" not in tensors) \
                and out_emb.weight is getattr(embed, "weight", None):
            gname = "token_embd"  # tied: the output projection is the embedding table
        tensor = tensors.get(f"{gname}.weight") if gname else None
        if tensor is None or tensor.tensor_type.name in ("F32", "F16", "BF16"):
            continue  # not in the file, or not quantized there: the dense layer is the file's tensor
        fmt = QUANT_FORMATS.get(int(tensor.tensor_type))
        if fmt is None:
            report.dequantized.setdefault(f"type {tensor.tensor_type.name} has no kernel", []).append(tensor.name)
            continue
        if tensor.name not in shared:
            raw = np.asarray(tensor.data)
            ok, order = _matching_order(raw, fmt.name, module.in_features, f"{module_name}.weight", module.weight,
                                        read, _row_orders(tensor.name, module.out_features, cfg))
            if not ok:
                report.dequantized.setdefault("rows do not match the converted weight", []).append(tensor.name)
                continue
            shared[tensor.name] = _kept_blocks(raw if order is None else raw[order], fmt, module.in_features)
            report.quantized_bytes += shared[tensor.name][0].numel()
        blocks, layout = shared[tensor.name]
        # the output layer keeps its float32 accumulations: rounded to bfloat16, near-equal logits tie
        # (one step is 0.125 at a logit of 20) and greedy decoding would pick the lower token id
        head = module is out_emb
        _replace(model, module_name, QuantLinear(blocks, layout.type_id, module.in_features, module.bias,
                                                 torch.float32 if head else dtype, module.out_features,
                                                 torch.float32 if head else None))
        report.num_quantized += 1
        report.formats[fmt.name] = report.formats.get(fmt.name, 0) + 1
    _quantize_embedding(model, tensors, shared, dtype, report, read)
    if report.dequantized:
        parts = [f"{len(v)} tensor(s) dequantized because {k} (e.g. {v[0]})" for k, v in report.dequantized.items()]
        report.notice = "; ".join(parts)
        logger.warning("model.quantization = 'gguf': %s", report.notice)
    return report


def _kept_blocks(raw: np.ndarray, fmt: QuantFormat, in_features: int) -> tuple[torch.Tensor, QuantFormat]:
    """The layer's own copy of ``raw`` ([out, row_bytes], maybe the mapped file, which may change), repacked
    where the kernel's path reads that faster: the repack reads the mapping and writes the copy, so the
    file's bytes are copied once either way (a copy first cost 1 s of a 1.5B model's cold start)."""
    with warnings.catch_warnings():  # read-only mapping: only read here, and copied before it is kept
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        view = torch.from_numpy(raw)
    blocks, layout = stored_blocks(view, fmt, in_features)
    return (blocks.clone() if blocks is view else blocks), layout


def _quantize_embedding(model: Any, tensors: dict, shared: dict[str, tuple[torch.Tensor, QuantFormat]],
                        dtype: torch.dtype, report: QuantReport, read: RowReader) -> None:
    embed = model.get_input_embeddings()
    tensor = tensors.get("token_embd.weight")
    if type(embed) is not nn.Embedding or tensor is None:
        return
    fmt = QUANT_FORMATS.get(int(tensor.tensor_type))
    if fmt is None or embed.embedding_dim % fmt.block_elems:
        if fmt is None and tensor.tensor_type.name not in ("F32", "F16", "BF16"):
            report.dequantized.setdefault(f"type {tensor.tensor_type.name} has no kernel", []).append(tensor.name)
        return
    blocks, layout = shared.get(tensor.name, (None, fmt))  # a tied output projection's blocks, maybe repacked
    if blocks is None:
        raw = np.asarray(tensor.data)
        name = next(n for n, m in model.named_modules() if m is embed)
        ok, _ = _matching_order(raw, fmt.name, embed.embedding_dim, f"{name}.weight", embed.weight, read, [None])
        if not ok:
            report.dequantized.setdefault("rows do not match the converted weight", []).append(tensor.name)
            return
        blocks = torch.from_numpy(np.array(raw))
        report.quantized_bytes += blocks.numel()
    model.set_input_embeddings(QuantEmbedding(blocks, layout.type_id, embed.embedding_dim, dtype, embed.padding_idx,
                                              embed.num_embeddings))


def load_kept_quantized(model_dir: str, gguf_file: Path, dtype: str, device: torch.device,
                        max_model_len: int | None, option: str) -> tuple[Any, int, QuantReport]:
    """The model of the conversion ``model_dir`` with ``gguf_file``'s quantized layers kept in their
    blocks, built as a skeleton (``loading/skeleton.py``): the dense weights that ``keep_quantized``
    replaces are never read. Raises ``SkeletonMiss`` where a parameter has no tensor of its name."""
    model, max_model_len = load_hf_model(model_dir, dtype, device, max_model_len, option=option, skeleton=True)
    tensors = CheckpointTensors(Path(model_dir))
    materialise(model, tensors, skip_weights_of=(nn.Linear, nn.Embedding))
    with torch.inference_mode():
        report = keep_quantized(model, gguf_file, model.dtype, tensors.rows)
    materialise(model, tensors)
    model.to(device)  # type: ignore[arg-type]  # (transformers types PreTrainedModel.to oddly: hf_model.py)
    model.requires_grad_(False)
    return model, max_model_len, report


def release_freed_memory() -> None:
    """Hand the heap pages the dropped dense weights held back to the OS (glibc's ``malloc_trim``;
    elsewhere nothing): without it the process keeps the bf16 conversion's size resident. Call
    it once ``keep_quantized`` has returned (its frame held the last references)."""
    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes of every distinct parameter and buffer of ``model`` (shared blocks counted once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _replace(model: nn.Module, qualified: str, new: nn.Module) -> None:
    parent_name, _, attr = qualified.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)
