"""RMSNorm fusion: the fused forward is taken only where it is bit-identical,
and a model's logits do not change by a single bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_marks import needs_kernel
from torch import nn

from speculant.model.fused_norms import _c_kernel_form, fuse_rms_norms, torch_sum_lanes
from speculant.model.kernels.build import load_kernel
from tiny_models import loaded_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_fused_model_gives_identical_logits(arch, dtype, tmp_path):
    """float32 norms fuse as they are; bfloat16/float16 ones normalise in float32
    before rounding, and take the upcast form: bit-exact either way."""
    model, ids = loaded_tiny_model(arch, tmp_path)
    model = model.to(dtype)
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        fused, kept = fuse_rms_norms(model)
        after = model(input_ids=ids).logits
    assert (fused, kept) == (2 * 2 + 1, 0)
    assert torch.equal(before, after)


class GemmaStyleRMSNorm(nn.Module):
    """Another formula under the same name pattern: scales by (1 + weight)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return x * (1.0 + self.weight)


def test_other_formula_keeps_its_own_forward():
    model = nn.Sequential(GemmaStyleRMSNorm(16))
    x = torch.randn(2, 16)
    want = model(x)
    assert fuse_rms_norms(model) == (0, 1)
    assert "forward" not in vars(model[0]) and torch.equal(model(x), want)



KERNEL = load_kernel()


@needs_kernel
def test_bf16_norms_take_the_c_kernel_and_stay_bit_identical(tmp_path):
    model, ids = loaded_tiny_model("llama", tmp_path)
    model = model.to(torch.bfloat16)
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        fuse_rms_norms(model)
        after = model(input_ids=ids).logits
    assert model.model.norm.forward.__name__.startswith("_c_kernel_forward_")
    assert torch.equal(before, after)


@needs_kernel
@settings(max_examples=80, deadline=None)
@given(width=st.sampled_from([8, 20, 64, 100, 576, 960, 2048, 4100]), rows=st.integers(1, 80),
       eps=st.sampled_from([1e-6, 1e-5, 1e-2]), scale=st.sampled_from([1e-3, 1.0, 300.0]), seed=st.integers(0, 99))
def test_c_kernel_equals_torch_bit_for_bit(width, rows, eps, scale, seed):
    """With the summation order settled on torch's own float32 sums, the output is torch's over
    widths (cascade levels, leftover vectors, a scalar tail), row counts, eps and magnitudes
    (an order taken from the output alone once passed a probe and failed one row in hundreds)."""
    norm = nn.Module()
    gen = torch.Generator().manual_seed(seed)
    norm.weight = nn.Parameter((torch.randn(width, generator=gen) * 0.5 + 1).to(torch.bfloat16), requires_grad=False)
    norm.variance_epsilon = eps
    x = (scale * torch.randn(rows, width, generator=gen)).to(torch.bfloat16)  # [T, H]
    want = norm.weight * F.rms_norm(x, (width,), eps=eps)
    lanes = torch_sum_lanes(width)
    assert lanes is not None, f"no lane count gives torch's sums of squares at width {width}"
    forward = _c_kernel_form(lanes)
    assert forward is not None
    assert torch.equal(forward(norm, x), want)
