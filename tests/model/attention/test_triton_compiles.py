"""The ``triton`` backend's kernels compile for an H100/H200 (sm_90) on a
machine without a GPU: Triton's compiler runs down to a cubin (its bundled
ptxas) from a signature, no driver needed. The interpreter tests check the
arithmetic but accept code the compiler refuses (types of loop-carried
values, constexpr rules, tl.dot shapes, shared memory), so each tile the
launcher picks for real shapes is compiled here with the launcher's own
constants (``attention_constants``, ``write_constants``), including the
integer arguments Triton specialises to constants when they equal 1.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="the `triton` package is not installed (the `test` extra brings it "
                                              "on Linux): the Triton kernels cannot be compiled")

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from speculant.model.attention import triton_kernels, triton_launch  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)
SHARED_MEMORY = 227 * 1024  # bytes per block on sm_90
POINTER = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
TREE_POINTERS = {"mask_offsets_ptr": "*i64", "masks_ptr": "*u8"}  # token trees' masks (read when HAS_TREE)

if triton_kernels.INTERPRETED:
    pytest.skip("TRITON_INTERPRET=1 is set for this whole process: the kernels were decorated for the "
                "interpreter and cannot be compiled", allow_module_level=True)


def compile_for_h200(fn, types: dict[str, str], consts: dict):
    """``fn`` compiled with argument ``types`` (default i32) and constexprs ``consts`` (+ num_warps)."""
    consts = dict(consts)
    options = {"num_warps": consts.pop("num_warps", 4)}
    signature = {name: "constexpr" if name in consts else types.get(name, "i32") for name in fn.arg_names}
    constexprs = {(fn.arg_names.index(name),): value for name, value in consts.items()}
    return triton.compile(ASTSource(fn, signature, constexprs), target=H200, options=options)


# (dtype, heads, kv heads, head dim, block size, max query len): decodes, verify runs,
# prefill chunks; Llama/Qwen/Mistral/Phi head layouts
SHAPES = [
    (torch.bfloat16, 32, 8, 128, 16, 1), (torch.bfloat16, 32, 8, 128, 16, 4), (torch.bfloat16, 32, 8, 128, 16, 512),
    (torch.float16, 32, 32, 64, 16, 1), (torch.float16, 32, 32, 80, 5, 64), (torch.float32, 32, 4, 128, 16, 8),
    (torch.bfloat16, 28, 4, 128, 1, 3), (torch.bfloat16, 16, 8, 256, 32, 100), (torch.bfloat16, 32, 1, 64, 16, 2),
]


@pytest.mark.parametrize("dtype, heads, kv_heads, head_dim, block_size, max_q", SHAPES,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_attention_kernel_compiles_for_sm90(dtype, heads, kv_heads, head_dim, block_size, max_q):
    consts = triton_launch.attention_constants(dtype, dtype, block_size, heads // kv_heads, max_q, head_dim, False)
    consts["HAS_TREE"] = max_q in (4, 8)  # the verify shapes compile with token trees' masks too
    types = {"out_ptr": POINTER[dtype], "query_ptr": POINTER[dtype], "key_cache_ptr": POINTER[dtype],
             "value_cache_ptr": POINTER[dtype], "cu_query_lens_ptr": "*i64", "seq_lens_ptr": "*i64",
             "block_tables_ptr": "*i64", **TREE_POINTERS, "scale_log2e": "fp32"}
    kernel = compile_for_h200(triton_kernels.paged_attention_kernel, types, consts)
    assert kernel.asm["cubin"] and kernel.metadata.shared <= SHARED_MEMORY, kernel.metadata.shared


def test_attention_kernel_compiles_with_one_sequence_and_unit_strides():
    """Triton turns integer arguments equal to 1 into constants: one span (the
    binary search then starts empty), unit strides, a one-block table."""
    consts = triton_launch.attention_constants(torch.bfloat16, torch.bfloat16, 16, 4, 1, 128, False)
    consts.update(num_seqs=1, stride_qd=1, stride_cd=1, stride_bt=1, head_dim=1, HAS_TREE=False)
    types = {"out_ptr": "*bf16", "query_ptr": "*bf16", "key_cache_ptr": "*bf16", "value_cache_ptr": "*bf16",
             "cu_query_lens_ptr": "*i64", "seq_lens_ptr": "*i64", "block_tables_ptr": "*i64", **TREE_POINTERS,
             "scale_log2e": "fp32"}
    assert compile_for_h200(triton_kernels.paged_attention_kernel, types, consts).asm["cubin"]


@pytest.mark.parametrize("dtype", list(POINTER), ids=str)
def test_write_kernel_compiles_for_sm90(dtype):
    consts = triton_launch.write_constants(300, 8, 128, 16, False)
    pointers = {name: POINTER[dtype] for name in ("key_ptr", "value_ptr", "key_cache_ptr", "value_cache_ptr")}
    kernel = compile_for_h200(triton_kernels.write_kv_kernel, {**pointers, "slot_ptr": "*i64"}, consts)
    assert kernel.asm["cubin"]
