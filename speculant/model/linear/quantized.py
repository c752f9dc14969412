"""Linear layers whose weight stays in a GGUF block format (``model.quantization = "gguf"``).

``QuantLinear`` holds the weight as the GGUF file stores it: one row of
``in_features`` weights per output feature, each row a run of blocks (Q4_K: 256
weights in 144 bytes; Q6_K: 256 in 210; Q8_0: 32 in 34 ...), as a ``uint8``
tensor ``[out_features, row_bytes]``; or, for Q4_K and Q6_K where the AVX-512
VNNI path runs, the same information repacked at load in groups of 16 rows
(``REPACKED_FORMATS``, ``csrc/quant_repack.c``: 4 codes of each row per 32-bit
lane, scales as bytes), which that path's group kernel reads without shuffles; Q4_0, Q4_1, Q5_0 and
Q8_0 likewise (``csrc/quant_repack_b32.c``, in the file's bytes per row). ``csrc/quant_linear.c`` computes
``y = x W^T + b``: it quantizes each input row to 8 bits per block of 32 and
takes integer dot products against the decoded weight blocks. A row's output
does not depend on the other rows of the call, so a speculative verify of n rows
gives each row the bits a one-row decode gives it.

``QUANT_FORMATS`` is the capability table: the GGUF types that have a kernel,
with their block sizes. A tensor of any other type is dequantized at load
(``loading/gguf_quant.py``), never refused. Every format runs the scalar
reference and the AVX2 and AVX-512 VNNI dot products over decoded tiles
(``csrc/quant_linear.c``; Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K tiles decoded with
AVX2, Q5_K with scalar code); Q4_K and Q6_K also have integer-only
AVX-512 VNNI kernels: per file row (``csrc/quant_avx512_vnni.c``) and per repacked
group of 16 rows (``csrc/quant_x16_avx512_vnni.c``), and so do the repacked blocks of
32 (``csrc/quant_x16_b32_avx512_vnni.c``); other paths read a repacked group row by
row through the reference decoder.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch
from torch import nn

from speculant.model.kernels.build import kernel_status, load_kernel

KERNEL_ISAS = {0: "scalar", 1: "avx2", 2: "avx512_vnni", 3: "neon", 4: "neon_dotprod"}
"""The quantized kernel's instruction paths (``speculant_qlinear_isa``)."""
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
ACTIVATION_ROUNDING = 2e-2
"""Relative error a layer's output may show from 8-bit activations alone: two inputs that differ
by float rounding can round to different 8-bit codes (one code is 1/127 of a block's largest
input). Load-time probes that compare two correct paths allow this much where a model has
layers that quantize their activations; a wrong seam or layout is off by tens of percent."""


@dataclass(frozen=True)
class QuantFormat:
    """One GGUF block format with a kernel."""

    name: str
    type_id: int
    """ggml's type number, as the GGUF file records it."""
    block_elems: int
    block_bytes: int
    """Bytes per block of one row; for a repacked layout, a group tile's bytes / ``group_rows``."""
    group_rows: int = 1
    """1: the file's layout, one row after another. 16: rows repacked in groups of 16
    (``csrc/quant_repack.c``), the group tile after tile, the last group padded with zero rows."""

    def storage_shape(self, out_features: int, in_features: int) -> tuple[int, int]:
        """The ``uint8`` blocks tensor's shape for a weight of ``[out_features, in_features]``."""
        groups = -(-out_features // self.group_rows)
        return groups, in_features // self.block_elems * self.block_bytes * self.group_rows


QUANT_FORMATS = {f.type_id: f for f in (
    QuantFormat("Q4_0", 2, 32, 18), QuantFormat("Q4_1", 3, 32, 20),
    QuantFormat("Q5_0", 6, 32, 22), QuantFormat("Q8_0", 8, 32, 34),
    QuantFormat("Q4_K", 12, 256, 144), QuantFormat("Q5_K", 13, 256, 176),
    QuantFormat("Q6_K", 14, 256, 210))}
REPACKED_FORMATS = {12: QuantFormat("Q4_K_X16", 76, 256, 148, 16), 14: QuantFormat("Q6_K_X16", 78, 256, 212, 16),
                    **{t: QuantFormat(f"{f.name}_X16", 64 + t, 32, f.block_bytes, 16)
                       for t, f in QUANT_FORMATS.items() if f.name in ("Q4_0", "Q4_1", "Q5_0", "Q8_0")}}
"""File type -> its layout repacked for the AVX-512 VNNI group kernels (Q4_K 1.03x, Q6_K 1.01x the file's
bytes; the blocks of 32, ``csrc/quant_repack_b32.c``, the file's bytes), padded to whole groups of 16 rows."""
STORAGE_FORMATS = {**QUANT_FORMATS, **{f.type_id: f for f in REPACKED_FORMATS.values()}}
"""Every layout a ``QuantLinear`` holds, by the type id the kernel reads."""


def repack_wanted(fmt: QuantFormat) -> bool:
    """Whether ``fmt``'s blocks should be repacked here: the kernel's path is AVX-512 VNNI, which
    reads the repacked layout fastest (every other path reads it too, more slowly)."""
    lib = load_kernel()
    return lib is not None and bool(lib.speculant_qrepack_wanted(fmt.type_id))


def stored_blocks(blocks: torch.Tensor, fmt: QuantFormat, in_features: int,
                  repack: bool | None = None) -> tuple[torch.Tensor, QuantFormat]:
    """The blocks a layer keeps for the file's ``blocks`` ``[out, row_bytes]`` and their format:
    repacked where ``repack`` (None: ``repack_wanted``) and the format has a repacked layout."""
    if fmt.type_id not in REPACKED_FORMATS or not (repack_wanted(fmt) if repack is None else repack):
        return blocks, fmt
    lib = load_kernel()
    if lib is None:
        raise RuntimeError(quant_kernel_unavailable_reason())
    target = REPACKED_FORMATS[fmt.type_id]
    src = blocks.contiguous()
    out = torch.empty(target.storage_shape(src.shape[0], in_features), dtype=torch.uint8)
    if lib.speculant_qrepack_x16(fmt.type_id, src.data_ptr(), src.shape[0], in_features, out.data_ptr()) != 0:
        raise ValueError(f"{fmt.name} blocks with {in_features} input features cannot be repacked")
    return out, target


def quant_kernel_unavailable_reason() -> str | None:
    """Why the quantized kernel cannot run here (None: it can)."""
    return None if load_kernel() is not None else f"the C kernels are not available ({kernel_status()})"


def kernel_isa() -> str:
    """The instruction path the quantized kernel uses on this CPU."""
    lib = load_kernel()
    return "none" if lib is None else KERNEL_ISAS[lib.speculant_qlinear_isa()]


def set_kernel_isa(name: str | None) -> str:
    """Force an instruction path (None: back to cpuid); ``RuntimeError`` where this CPU lacks it."""
    lib = load_kernel()
    if lib is None:
        raise RuntimeError(quant_kernel_unavailable_reason())
    code = -1 if name is None else {v: k for k, v in KERNEL_ISAS.items()}[name]
    got = lib.speculant_qlinear_set_isa(code)
    if got < 0:
        raise RuntimeError(f"quantized kernel path {name!r} does not run on this CPU")
    return KERNEL_ISAS[got]


def available_isas() -> list[str]:
    lib = load_kernel()
    return [] if lib is None else [n for c, n in KERNEL_ISAS.items() if lib.speculant_qlinear_isa_available(c)]


def activation_rounding(model: nn.Module) -> float:
    """``ACTIVATION_ROUNDING`` where some layer of ``model`` quantizes its activations, else 0."""
    return ACTIVATION_ROUNDING if any(getattr(m, "quantizes_activations", False) for m in model.modules()) else 0.0


class QuantLinear(nn.Module):
    """Inference-only ``nn.Linear`` replacement over GGUF blocks: ``[..., in] -> [..., out]``."""

    quantizes_activations = True
    """Capability: inputs are rounded to 8 bits per block (see ``ACTIVATION_ROUNDING``)."""
    blocks: torch.Tensor  # [out_features, row_bytes] uint8
    bias_f32: torch.Tensor | None  # [out_features]

    def __init__(self, blocks: torch.Tensor, type_id: int, in_features: int, bias: torch.Tensor | None,
                 dtype: torch.dtype, out_features: int | None = None, out_dtype: torch.dtype | None = None) -> None:
        # blocks: [out_features, row_bytes] uint8, the file's bytes (or a repacked layout's
        # storage_shape, with out_features given); bias: [out_features] or None.
        # out_dtype: the output's dtype (None: the input's); the output layer keeps float32 logits
        super().__init__()
        fmt = STORAGE_FORMATS[type_id]
        if in_features % fmt.block_elems or in_features % 32:
            raise ValueError(f"{fmt.name} weight with {in_features} input features: not a whole number of "
                             f"{fmt.block_elems}-weight blocks")
        out_features = blocks.shape[0] if out_features is None else out_features
        if blocks.dtype != torch.uint8 or tuple(blocks.shape) != fmt.storage_shape(out_features, in_features):
            raise ValueError(f"{fmt.name} blocks of shape {tuple(blocks.shape)} / {blocks.dtype} do not hold "
                             f"{out_features} rows of {in_features} weights")
        if dtype not in _DTYPE_CODES:
            raise ValueError(f"quantized linear layers compute in float32 or bfloat16, not {dtype}")
        self.format = fmt
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)
        self.register_buffer("bias_f32", None if bias is None else bias.detach().float().contiguous(),
                             persistent=False)
        self.compute_dtype = dtype
        self.out_dtype = out_dtype
        lib = load_kernel()
        if lib is None:
            raise RuntimeError(quant_kernel_unavailable_reason())
        self._lib = lib

    @property
    def nbytes(self) -> int:
        return self.blocks.numel() + (0 if self.bias_f32 is None else self.bias_f32.numel() * 4)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format.name}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]
        return self._call(x)

    @functools.cached_property
    def _call(self) -> SiblingsCall:
        return SiblingsCall([self])

    @staticmethod
    def siblings_call(layers: list[QuantLinear]) -> SiblingsCall:
        """One call computing the concatenated outputs of ``layers`` (see ``SiblingsCall``)."""
        return SiblingsCall(layers)


class SiblingsCall:
    """The concatenated outputs of quantized layers that read one input (q/k/v, gate/up):
    ``[..., in] -> [..., sum(out)]`` in one kernel call, the input quantized once."""

    def __init__(self, layers: list[QuantLinear]) -> None:
        first = layers[0]
        if any(m.in_features != first.in_features or m.compute_dtype != first.compute_dtype
               or m.out_dtype != first.out_dtype for m in layers):
            raise ValueError("sibling quantized layers must read the same input width and dtype")
        n = self.num = len(layers)
        self.owners = [(m.blocks, m.bias_f32) for m in layers]  # what the pointers below point into
        self.types = (ctypes.c_int * n)(*[m.format.type_id for m in layers])
        self.weights = (ctypes.c_void_p * n)(*[m.blocks.data_ptr() for m in layers])
        self.outs = (ctypes.c_int64 * n)(*[m.out_features for m in layers])
        self.biases = (ctypes.c_void_p * n)(*[None if m.bias_f32 is None else m.bias_f32.data_ptr() for m in layers])
        self.width, self.dtype, self.out_dtype = first.in_features, first.compute_dtype, first.out_dtype
        self.total = sum(m.out_features for m in layers)
        self.kernel, self.code = first._lib.speculant_qlinear_multi, _DTYPE_CODES[first.compute_dtype]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., sum(out)]
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.width)
        if flat.dtype != self.dtype:
            flat = flat.to(self.dtype)
        if flat.stride(-1) != 1 or flat.stride(0) < self.width:
            flat = flat.contiguous()
        rows = flat.shape[0]
        out = torch.empty(rows, self.total, dtype=self.dtype)
        if rows:
            code = self.kernel(self.num, self.types, self.weights, self.outs, self.biases, self.width,
                               flat.data_ptr(), rows, flat.stride(0), self.code, out.data_ptr(), self.total,
                               torch.get_num_threads())
            if code != 0:
                raise RuntimeError(f"quantized linear kernel failed with code {code} "
                                   f"({'out of memory' if code == -2 else 'bad arguments'})")
        return out.reshape(*lead, self.total).to(self.out_dtype or x.dtype)


class QuantEmbedding(nn.Module):
    """``nn.Embedding`` over GGUF blocks: ids ``[...]`` -> ``[..., embedding_dim]``, each row
    dequantized when looked up (the table may be the output projection's blocks, shared)."""

    blocks: torch.Tensor  # [num_embeddings, row_bytes] uint8

    def __init__(self, blocks: torch.Tensor, type_id: int, embedding_dim: int, dtype: torch.dtype,
                 padding_idx: int | None = None, num_embeddings: int | None = None) -> None:
        # blocks: [num_embeddings, row_bytes] uint8 (or a repacked layout's storage_shape, with num_embeddings)
        super().__init__()
        self.format = STORAGE_FORMATS[type_id]
        self.num_embeddings = blocks.shape[0] if num_embeddings is None else num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.register_buffer("blocks", blocks, persistent=False)
        self.compute_dtype = dtype
        lib = load_kernel()
        if lib is None:
            raise RuntimeError(quant_kernel_unavailable_reason())
        self._lib = lib

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty(flat.numel(), self.embedding_dim, dtype=torch.float32)
        code = self._lib.speculant_qdequant_rows(self.format.type_id, self.blocks.data_ptr(), self.num_embeddings,
                                                 self.embedding_dim, flat.data_ptr(), flat.numel(), out.data_ptr())
        if code != 0:
            bad = flat[(flat < 0) | (flat >= self.num_embeddings)]
            raise IndexError(f"token id {bad[0].item() if bad.numel() else '?'} is outside the embedding table "
                             f"of {self.num_embeddings} rows")
        return out.to(self.compute_dtype).reshape(*ids.shape, self.embedding_dim)
