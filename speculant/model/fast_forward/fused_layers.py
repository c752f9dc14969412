"""Every decoder layer of a bfloat16 forward in one C call (``csrc/decoder_bf16.c``).

The fast decoder's per-operator loop makes ten calls per layer from Python,
each with its ctypes conversion, tensor allocation and OpenMP fork and join:
at decode sizes on SmolLM2 that is about as long as the arithmetic. Where
every piece of a layer already runs on our own C kernels (bfloat16 on a CPU
with AVX512-BF16: the packed ``DotLinear`` projections, the C RMSNorm in
torch's summation order, the rotary and silu-table kernels, the paged
attention kernel), ``decoder_bf16.c`` runs the same row-level code for all
layers inside one parallel region, so its bits are the per-operator loop's.

Projections kept in GGUF blocks (``model.quantization = "gguf"``, ``QuantLinear``) run there
too: each layer row then points at a descriptor of its q/k/v, o, gate/up and down matrices
(``quant_descriptor``), and the C loop calls the quantized kernel's team-level function, the
very row code ``QuantLinear`` runs, so the bits are the per-operator loop's there as well.

``FusedLayers.build`` says why it cannot take a model (the per-operator loop
then runs, as before); ``takes`` says whether one forward's batch qualifies:
the runner's ``cpu_kernel`` backend (which takes every span, prefill chunks
cut into pieces) and contiguous bfloat16 caches.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from speculant.model.attention.cpu_kernel import CpuKernelMetadata
from speculant.model.attention.span_bounds import span_fault_message
from speculant.model.fast_forward.plan import Plan
from speculant.model.kernels.abi import SPAN_BAD_FIELDS, fast_bf16_unavailable_reason
from speculant.model.kernels.build import load_kernel
from speculant.model.linear.dot_linear import DotLinear
from speculant.model.linear.merged import MergedSlice
from speculant.model.linear.quantized import QuantEmbedding, QuantLinear

FIELDS = ("in_norm", "post_norm", "qkv_w", "qkv_b", "o_w", "o_b", "gu_w", "gu_b", "down_w", "down_b",
          "k_cache", "v_cache", "qkv_q", "o_q", "gu_q", "down_q")
"""The per-layer pointer row, in ``decoder_bf16.c``'s ``enum field`` order."""
STATUS = {-1: "an attention scratch allocation failed", -2: "the quantized projections' scratch allocation failed",
          -3: "a slot in slot_mapping lies outside the cache",
          -6: "a span reads outside the KV pool",
          -4: "this CPU has no AVX512-BF16", -5: "the norm's lane count is not one the kernel follows"}


@lru_cache(maxsize=1)
def silu_table() -> torch.Tensor:
    """``F.silu`` of every bfloat16 value, as int16 bits indexed by the gate's 16 bits (unsigned)."""
    gates = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return F.silu(gates).view(torch.int16).roll(-(1 << 15)).contiguous()


def _merged_dot(modules: list[Any]) -> DotLinear | None:
    shared = {id(m._shared) for m in modules if isinstance(m, MergedSlice)}
    if len(shared) != 1 or len(modules) != sum(isinstance(m, MergedSlice) for m in modules):
        return None
    merged = modules[0]._shared.merged
    return merged if isinstance(merged, DotLinear) else None


def quant_descriptor(modules: list[Any], block: int) -> torch.Tensor:
    """``decoder_bf16.c``'s descriptor of one projection kept in GGUF blocks: int64
    ``[n_mats, block, then per matrix type, blocks address, out_features, float32 bias address or 0]``."""
    row = [len(modules), block]
    for m in modules:
        row += [m.format.type_id, m.blocks.data_ptr(), m.out_features,
                0 if m.bias_f32 is None else m.bias_f32.data_ptr()]
    return torch.tensor(row, dtype=torch.int64)


def _quant_projection(lib: ctypes.CDLL, modules: list[Any]) -> torch.Tensor | None:
    """The descriptor for ``modules`` where all are bfloat16 ``QuantLinear`` with a kernel, else None."""
    if not all(isinstance(m, QuantLinear) and m.compute_dtype == torch.bfloat16 for m in modules) or len(modules) > 3:
        return None
    types = (ctypes.c_int * len(modules))(*[m.format.type_id for m in modules])
    block = lib.speculant_qlinear_block(len(modules), types, modules[0].in_features)
    return quant_descriptor(modules, block) if block else None


def _norm_lanes(module: Any) -> int | None:
    return getattr(getattr(module.forward, "__func__", None), "c_kernel_lanes", None)


class FusedLayers:
    """All layers of one model as a pointer table for ``speculant_decoder_bf16``."""

    def __init__(self, lib: ctypes.CDLL, table: torch.Tensor, plan: Plan, hidden: int, eps: float,
                 lanes: int, keep: list[torch.Tensor]) -> None:
        self._kernel = lib.speculant_decoder_bf16  # its signature is set where the library loads
        self._scratch_elems = lib.speculant_decoder_scratch_elems
        self.table = table  # [L, len(FIELDS)] int64 addresses; the cache columns filled per cache list
        self.plan, self.hidden, self.eps, self.lanes = plan, hidden, eps, lanes
        self._keep = keep  # the tensors the table points into (biases made float32 here)
        self._caches: tuple[int, int, int] | None = None
        self._silu = silu_table()

    @classmethod
    def build(cls, base: Any, plan: Plan) -> tuple[FusedLayers | None, str | None]:
        """The fused layers for ``base`` (the decoder stack), or None and why not."""
        lib = load_kernel()
        if lib is None:
            return None, "the C kernels are not loaded"
        if lib.speculant_decoder_layer_fields() != len(FIELDS):
            return None, "the kernel library's layer layout differs from this module's (a stale build)"
        if (reason := fast_bf16_unavailable_reason(lib)) is not None:
            return None, reason
        embed = base.embed_tokens
        quantized = isinstance(embed, QuantEmbedding)
        dtype, device = (embed.compute_dtype, embed.blocks.device) if quantized else (embed.weight.dtype,
                                                                                      embed.weight.device)
        if dtype != torch.bfloat16 or device.type != "cpu":
            return None, "only bfloat16 models on the CPU"
        if plan.intermediate_size % 64:
            return None, f"intermediate_size {plan.intermediate_size} is not a multiple of 64 (the silu table's)"
        rows, keep, norms = [], [], set()
        for i, layer in enumerate(base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv, gate_up = _merged_dot([attn.q_proj, attn.k_proj, attn.v_proj]), _merged_dot([mlp.gate_proj,
                                                                                              mlp.up_proj])
            linears = {"qkv": qkv, "o": attn.o_proj, "gu": gate_up, "down": mlp.down_proj}
            quant = {"qkv": _quant_projection(lib, [attn.q_proj, attn.k_proj, attn.v_proj]),
                     "o": _quant_projection(lib, [attn.o_proj]),
                     "gu": _quant_projection(lib, [mlp.gate_proj, mlp.up_proj]),
                     "down": _quant_projection(lib, [mlp.down_proj])}
            missing = [name for name, lin in linears.items() if not isinstance(lin, DotLinear) and quant[name] is None]
            if missing:
                return None, (f"layer {i}'s {', '.join(missing)} projection(s) are neither on the C bfloat16 linear "
                              "kernel nor bfloat16 GGUF blocks with a quantized kernel")
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                lanes = _norm_lanes(norm)
                if lanes is None:
                    return None, f"layer {i}'s norms are not on the C RMSNorm kernel (not proven exact)"
                norms.add((lanes, float(norm.variance_epsilon)))
            row = [layer.input_layernorm.weight.data_ptr(), layer.post_attention_layernorm.weight.data_ptr()]
            for name, lin in linears.items():
                if quant[name] is not None:
                    row += [0, 0]
                    continue
                assert isinstance(lin, DotLinear)
                bias = lin._bias32
                row += [lin.blocked_weight.data_ptr(), 0 if bias is None else bias.data_ptr()]
                keep += [lin.blocked_weight] + ([bias] if bias is not None else [])
            descriptors = [quant[name] for name in linears]
            keep += [d for d in descriptors if d is not None]  # the blocks are the modules' own buffers
            rows.append(row + [0, 0] + [0 if d is None else d.data_ptr() for d in descriptors])
        if len(norms) != 1:
            return None, f"the layers' norms differ in lane count or epsilon ({sorted(norms)})"
        (lanes, eps), = norms
        table = torch.tensor(rows, dtype=torch.int64)
        hidden = embed.embedding_dim if quantized else embed.weight.shape[1]
        return cls(lib, table, plan, hidden, eps, lanes, keep), None

    def takes(self, backend: Any, metadata: Any, key_caches: list[torch.Tensor]) -> bool:
        """Whether this forward's batch runs here (see the module docstring)."""
        if not isinstance(metadata, CpuKernelMetadata) or not metadata.pieces.ids.numel():
            return False
        cache = key_caches[0]
        return cache.dtype == torch.bfloat16 and cache.is_contiguous() and getattr(backend, "_lib", None) is not None

    def _bind_caches(self, key_caches: list[torch.Tensor], value_caches: list[torch.Tensor]) -> None:
        key = (id(key_caches), key_caches[0].data_ptr(), value_caches[0].data_ptr())
        if self._caches == key:
            return
        if not all(c.is_contiguous() and c.dtype == torch.bfloat16 for c in (*key_caches, *value_caches)):
            raise ValueError("the fused layers need contiguous bfloat16 K/V caches")
        self.table[:, FIELDS.index("k_cache")] = torch.tensor([c.data_ptr() for c in key_caches])
        self.table[:, FIELDS.index("v_cache")] = torch.tensor([c.data_ptr() for c in value_caches])
        self._caches = key

    def run(self, hidden: torch.Tensor,  # [T, H] bfloat16 contiguous, the residual stream: updated in place
            cos: torch.Tensor, sin: torch.Tensor,  # [T, 1, D] contiguous (sin with its first half negated)
            metadata: CpuKernelMetadata,
            key_caches: list[torch.Tensor], value_caches: list[torch.Tensor]) -> None:
        self._bind_caches(key_caches, value_caches)
        plan, pieces = self.plan, metadata.pieces
        num_tokens, cache = hidden.shape[0], key_caches[0]
        _, block_size, num_kv, head_dim = cache.shape
        bad = torch.zeros(SPAN_BAD_FIELDS, dtype=torch.int64)
        scratch = torch.empty(self._scratch_elems(num_tokens, self.hidden, plan.num_heads, num_kv, head_dim,
                                                  plan.intermediate_size), dtype=torch.bfloat16)
        status = self._kernel(
            self.table.data_ptr(), self.table.shape[0], hidden.data_ptr(), num_tokens, self.hidden,
            plan.num_heads, num_kv, head_dim, plan.intermediate_size, self.eps, self.lanes, cos.data_ptr(),
            sin.data_ptr(), metadata.slot_mapping.data_ptr(), cache.shape[0] * block_size,
            pieces.cu_query_lens.data_ptr(), pieces.starts.data_ptr(), pieces.block_tables.data_ptr(),
            pieces.block_tables.shape[0], pieces.block_tables.shape[1], pieces.ids.data_ptr(), pieces.ids.numel(),
            block_size, plan.scaling, *pieces.mask_pointers(), self._silu.data_ptr(), scratch.data_ptr(),
            torch.get_num_threads(), bad.data_ptr())
        if status == -6:
            raise IndexError("the fused bfloat16 decoder layers: " + span_fault_message(
                bad.tolist(), cache.shape[0], block_size, num_tokens, pieces.block_tables.shape[0]))
        if status != 0:
            raise RuntimeError(f"the fused bfloat16 decoder layers failed: {STATUS.get(status, status)}")
