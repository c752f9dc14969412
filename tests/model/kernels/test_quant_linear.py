"""The quantized linear kernel (csrc/quant_linear.c) against a float64 reference, per format and path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speculant.model.linear.quantized import (
    QUANT_FORMATS,
    REPACKED_FORMATS,
    QuantEmbedding,
    QuantLinear,
    available_isas,
    set_kernel_isa,
    stored_blocks,
)
from tests.kernel_marks import needs_kernel
from tests.model.kernels.quant_blocks import activation_block, dequantize, quantize_activations, random_blocks

pytestmark = needs_kernel
FILE_FORMATS = sorted(QUANT_FORMATS.values(), key=lambda f: f.type_id)
LAYOUTS = [(f, False) for f in FILE_FORMATS] + [(QUANT_FORMATS[t], True) for t in sorted(REPACKED_FORMATS)]
"""(file format, repacked): every format in the file's layout, and Q4_K / Q6_K repacked in groups of 16 rows."""
LAYOUT_IDS = [f.name + ("-x16" if repack else "") for f, repack in LAYOUTS]
ROWS = (1, 2, 3, 7, 16, 33, 64)


@pytest.fixture(params=["scalar", "avx2", "avx512_vnni"])
def isa(request):
    if request.param not in available_isas():
        pytest.skip(f"this CPU cannot run the {request.param} path")
    set_kernel_isa(request.param)
    yield request.param
    set_kernel_isa(None)


def _layer(fmt, n: int, k: int, seed: int, bias: bool, dtype=torch.float32, repack: bool = False):
    rng = np.random.default_rng(seed)
    blocks = random_blocks(fmt.name, fmt.block_elems, fmt.block_bytes, n, k, rng)
    b = torch.from_numpy(rng.normal(size=n).astype(np.float32)) if bias else None
    kept, layout = stored_blocks(torch.from_numpy(blocks), fmt, k, repack=repack)
    assert (layout.group_rows > 1) == repack
    layer = QuantLinear(kept, layout.type_id, k, b, dtype, n)
    return layer, dequantize(blocks, fmt.name, k), b


def _shapes(fmt):
    # odd output counts, and K as one block, several blocks and a tail of 32 after whole 256-tiles
    ks = (256, 768) if fmt.block_elems == 256 else (32, 96, 288)
    return [(n, k) for n in (1, 5, 19) for k in ks]


@pytest.mark.parametrize(("fmt", "repack"), LAYOUTS, ids=LAYOUT_IDS)
def test_matches_float64_reference(fmt, repack, isa):
    for n, k in _shapes(fmt):
        layer, w, bias = _layer(fmt, n, k, seed=n * 1000 + k, bias=n != 5, repack=repack)
        for rows in ROWS:
            x = torch.from_numpy(np.random.default_rng(rows).normal(size=(rows, k)).astype(np.float32))
            got = layer(x).double().numpy()
            offset = 0 if bias is None else bias.double().numpy()
            ref = quantize_activations(x.numpy(), activation_block(fmt.block_elems)) @ w.T + offset
            scale = np.abs(ref).max() + 1e-30
            assert np.abs(got - ref).max() / scale < 2e-5, (fmt.name, repack, isa, n, k, rows)
            exact = x.double().numpy() @ w.T + (0 if bias is None else bias.double().numpy())
            assert np.abs(got - exact).max() / (np.abs(exact).max() + 1e-30) < 0.05  # 8-bit activations


@pytest.mark.parametrize(("fmt", "repack"), LAYOUTS, ids=LAYOUT_IDS)
def test_rows_do_not_depend_on_the_batch(fmt, repack, isa):
    k = 512 if fmt.block_elems == 256 else 160
    layer, _, _ = _layer(fmt, 37, k, seed=3, bias=True, dtype=torch.bfloat16, repack=repack)
    x = torch.randn(150, k, generator=torch.Generator().manual_seed(1)).bfloat16()  # more than one 64-row chunk
    batched = layer(x)
    for r in (0, 1, 31, 63, 64, 127, 149):
        assert torch.equal(layer(x[r:r + 1]), batched[r:r + 1])
    assert torch.equal(layer(x[5:12]), batched[5:12])


@pytest.mark.parametrize(("fmt", "repack"), LAYOUTS, ids=LAYOUT_IDS)
def test_rows_do_not_depend_on_the_thread_count(fmt, repack, isa):
    # the team shares each row's activation blocks out among its threads: a row's blocks are
    # quantized by whichever thread gets them, and the output must keep every bit for 1..3 threads
    k = 1280 if fmt.block_elems == 256 else 352  # 5 tiles of 256 / 11 blocks of 32: uneven shares
    layer, _, _ = _layer(fmt, 37, k, seed=4, bias=True, dtype=torch.bfloat16, repack=repack)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(6)).bfloat16()
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append((layer(x[:1]), layer(x)))
    finally:
        torch.set_num_threads(before)
    for one, three in outs:
        assert torch.equal(one, outs[0][0]) and torch.equal(three, outs[0][1])
        assert torch.equal(three[:1], one)


@pytest.mark.parametrize("repack", [False, True], ids=["file", "x16"])
def test_every_path_agrees_with_the_scalar_reference(repack):
    fmt = QUANT_FORMATS[12]
    layer, _, _ = _layer(fmt, 23, 1024, seed=5, bias=True, repack=repack)
    x = torch.randn(9, 1024, generator=torch.Generator().manual_seed(2))
    outs = {}
    try:
        for name in available_isas():
            set_kernel_isa(name)
            outs[name] = layer(x)
    finally:
        set_kernel_isa(None)
    assert len(outs) >= 1
    for out in outs.values():
        torch.testing.assert_close(out, outs["scalar"], rtol=1e-5, atol=1e-5 * outs["scalar"].abs().max().item())


@pytest.mark.parametrize("type_id", sorted(REPACKED_FORMATS))
def test_repacked_rows_hold_the_files_weights(type_id):
    """The repacked layout keeps every weight: its rows, dequantized by the reference decoder (an
    embedding lookup), are the file rows' values bit for bit, padding rows included in no row; and it
    stays within 1.03x of the file's bytes."""
    fmt = QUANT_FORMATS[type_id]
    n, k = 37, 768  # two whole groups of 16 rows and a padded one
    blocks = torch.from_numpy(random_blocks(fmt.name, fmt.block_elems, fmt.block_bytes, n, k,
                                            np.random.default_rng(7)))
    kept, layout = stored_blocks(blocks, fmt, k, repack=True)
    assert kept.shape[0] == 3 and kept.numel() <= 1.03 * blocks.numel() * 48 / n
    ids = torch.arange(n)
    want = QuantEmbedding(blocks, type_id, k, torch.float32)(ids)
    got = QuantEmbedding(kept, layout.type_id, k, torch.float32, None, n)(ids)
    assert torch.equal(got, want)
    np.testing.assert_allclose(want.double().numpy(), dequantize(blocks.numpy(), fmt.name, k), rtol=0, atol=0)


def test_bad_shapes_are_refused_with_the_reason():
    fmt = QUANT_FORMATS[12]
    with pytest.raises(ValueError, match="Q4_K weight with 300 input features: not a whole number of 256-weight"):
        QuantLinear(torch.zeros(4, 144, dtype=torch.uint8), fmt.type_id, 300, None, torch.float32)
    with pytest.raises(ValueError, match=r"Q4_K blocks of shape \(4, 100\)"):
        QuantLinear(torch.zeros(4, 100, dtype=torch.uint8), fmt.type_id, 256, None, torch.float32)
    x16 = REPACKED_FORMATS[12]
    with pytest.raises(ValueError, match=r"Q4_K_X16 blocks of shape \(1, 2368\) / torch.uint8 do not hold 17 rows"):
        QuantLinear(torch.zeros(1, 2368, dtype=torch.uint8), x16.type_id, 256, None, torch.float32, 17)


@pytest.mark.parametrize(("cap", "want"), [("scalar", "scalar"), ("avx2", "avx2"), ("avx512", "avx2")])
def test_the_kernels_isa_cap_caps_the_quantized_path(cap, want):
    """SPECULANT_CPU_ISA caps the quantized dot products too (the best path under the kernels' active one)."""
    from speculant.model.kernels import abi
    from speculant.model.kernels.build import load_kernel
    from speculant.model.linear.quantized import kernel_isa

    lib = load_kernel()
    if cap not in abi.runnable_isas(lib):
        pytest.skip(f"this CPU cannot run the {cap} path")
    abi.set_kernel_isa(lib, cap)
    try:
        assert kernel_isa() == want
    finally:
        abi.set_kernel_isa(lib, None)
    if abi.requested_isa() is None:  # SPECULANT_CPU_ISA unset: uncapped, the best this CPU has
        assert kernel_isa() == available_isas()[-1]


def test_repacking_follows_the_kernel_path():
    """Q4_K and Q6_K are repacked at load where the AVX-512 VNNI path runs (its group kernel reads
    them fastest), and kept in the file's layout on every other path; other formats never are."""
    from speculant.model.linear.quantized import repack_wanted

    try:
        for name in available_isas():
            set_kernel_isa(name)
            for fmt in FILE_FORMATS:
                assert repack_wanted(fmt) == (name == "avx512_vnni" and fmt.type_id in REPACKED_FORMATS), name
    finally:
        set_kernel_isa(None)
