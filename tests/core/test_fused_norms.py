"""RMSNorm fusion: the fused forward is taken only where it is bit-identical,
and a model's logits do not change by a single bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from speculant.model.fused_norms import fuse_rms_norms
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

