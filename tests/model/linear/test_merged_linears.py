"""Sibling projections merged into one shared GEMM: same outputs in any call
order, refused where the group is not uniform, and a model's logits stay
within the packing probe's tolerance."""

from __future__ import annotations

import pytest
import torch
from kernel_marks import require_bf16_paths
from torch import nn

from speculant.model.linear.backend import OneDNNLinear, pack_linear_layers
from speculant.model.linear.dot_linear import DotLinear, dot_linear_unavailable_reason
from speculant.model.linear.merged import MergedSlice, merge_sibling_linears
from tiny_models import loaded_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
DOT_REASON = dot_linear_unavailable_reason(torch.zeros(16, 16, dtype=torch.bfloat16))
KINDS = {"onednn": OneDNNLinear, "avx512_bf16": DotLinear}


def _attention_like(bias_k: bool = False) -> nn.Module:
    torch.manual_seed(0)
    block = nn.Module()
    block.q_proj, block.k_proj, block.v_proj = nn.Linear(32, 32, bias=False), nn.Linear(32, 16, bias=bias_k), \
        nn.Linear(32, 16, bias=False)
    return block


def test_any_call_order_and_repeats_give_each_projection_its_own_output():
    block = _attention_like()
    x, y = torch.randn(1, 3, 32), torch.randn(1, 2, 32)
    want = {n: getattr(block, n)(x) for n in ("q_proj", "k_proj", "v_proj")}
    want_y = block.k_proj(y)
    pack_linear_layers(block, "onednn")
    assert merge_sibling_linears(block) == 1 and isinstance(block.k_proj, MergedSlice)
    with torch.no_grad():
        got = {"k_proj": block.k_proj(x), "q_proj": block.q_proj(x)}
        got_y = block.k_proj(y)               # another input before v_proj took its slice
        got["v_proj"] = block.v_proj(x)
        again = block.q_proj(x)               # a repeated call recomputes
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-5), name
    assert torch.allclose(got_y, want_y, atol=1e-5) and torch.allclose(again, want["q_proj"], atol=1e-5)
    assert torch.equal(block.k_proj.weight, block.k_proj._shared.merged.weight[32:48])


def test_groups_that_disagree_on_bias_or_are_not_packed_stay_separate():
    block = _attention_like(bias_k=True)
    pack_linear_layers(block, "onednn")
    assert merge_sibling_linears(block) == 0 and isinstance(block.k_proj, OneDNNLinear)
    assert merge_sibling_linears(_attention_like()) == 0     # plain nn.Linear: not packed


@pytest.mark.parametrize("backend, dtype, tolerance", [
    ("onednn", torch.float32, 1e-4),
    # the dot-product kernel: one bfloat16 rounding may differ per layer (see test_linear_backend)
    ("avx512_bf16", torch.bfloat16, 2.0**-5),
])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_merged_model_logits_match(arch, backend, dtype, tolerance, tmp_path):
    if backend == "avx512_bf16" and DOT_REASON is not None:
        require_bf16_paths()
    model, ids = loaded_tiny_model(arch, tmp_path)
    model = model.to(dtype)
    with torch.inference_mode():
        want = model(input_ids=ids).logits.float()
        pack_linear_layers(model, backend)
        assert merge_sibling_linears(model) == 2 * 2     # Q/K/V and gate/up in each of 2 layers
        assert type(model.model.layers[0].mlp.up_proj._shared.merged) is KINDS[backend]
        got = model(input_ids=ids).logits.float()
    assert (got - want).abs().max().item() <= tolerance * want.abs().max().item()
