"""The bf16 rotary kernel (csrc/rotary.c) against the fast decoder's torch form, bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speculant.model.attention.cpu_kernel_build import kernel_status, load_kernel
from speculant.model.fast_forward.decoder import _rotate_torch, rotary_call

needs_kernel = pytest.mark.skipif(load_kernel() is None, reason=f"no C kernels here: {kernel_status()}")


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
