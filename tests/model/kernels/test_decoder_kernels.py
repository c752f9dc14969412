"""The fast decoder's bf16 C kernels against its torch forms, bit for bit: rotary
(csrc/rotary.c) and silu(gate) * up (csrc/silu_mul.c)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_marks import needs_kernel

from speculant.model.fast_forward.decoder import _rotate_torch, _silu_mul_torch, rotary_call, silu_mul_call


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 12), heads=st.integers(1, 6), dim=st.sampled_from([2, 8, 64, 128]),
       extra=st.integers(0, 3), scale=st.sampled_from([1e-2, 1.0, 50.0]), seed=st.integers(0, 99))
def test_c_rotary_equals_the_torch_form(tokens, heads, dim, extra, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    # a slice of a wider fused projection: token stride (heads + extra) * dim
    fused = (scale * torch.randn(tokens, (heads + extra) * dim, generator=gen)).to(torch.bfloat16)
    qk = fused[:, :heads * dim].view(tokens, heads, dim)  # [T, heads, D]
    angles = torch.rand(tokens, 1, dim, generator=gen) * 6.3
    cos = angles.cos().to(torch.bfloat16)  # [T, 1, D]
    sin = angles.sin().to(torch.bfloat16)
    sin[..., :dim // 2].neg_()
    rotate = rotary_call(qk)
    assert rotate is not _rotate_torch
    assert torch.equal(rotate(qk, cos, sin, dim // 2), _rotate_torch(qk, cos, sin, dim // 2))


def test_float32_and_other_devices_use_the_torch_form():
    assert rotary_call(torch.zeros(1, dtype=torch.float32)) is _rotate_torch
    assert rotary_call(torch.zeros(1, dtype=torch.bfloat16, device="meta")) is _rotate_torch


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_c_silu_mul_equals_torch_for_every_gate_value(rows):
    """All 65,536 bfloat16 gate values (NaN, infinities and denormals included), each paired
    with random up values, in rows of a strided fused gate/up projection."""
    gates = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    inter = 1024
    gates = gates.view(-1, inter)  # [64, 1024]
    for start in range(0, gates.shape[0], rows):
        gate = gates[start:start + rows]
        up = torch.randn(gate.shape, generator=torch.Generator().manual_seed(start)).to(torch.bfloat16)
        gate_up = torch.cat([gate, up], dim=1)  # [rows, 2 I]
        silu_mul = silu_mul_call(gate_up, inter)
        assert silu_mul is not _silu_mul_torch
        got, want = silu_mul(gate_up, inter), _silu_mul_torch(gate_up, inter)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_silu_mul_keeps_torch_for_widths_with_a_scalar_tail_and_other_dtypes():
    assert silu_mul_call(torch.zeros(1, dtype=torch.bfloat16), 1000) is _silu_mul_torch
    assert silu_mul_call(torch.zeros(1, dtype=torch.float32), 1024) is _silu_mul_torch
