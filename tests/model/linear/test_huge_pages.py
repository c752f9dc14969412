"""Packed bfloat16 weights on one transparent-huge-page arena (speculant/model/linear/huge_pages.py).

Checked: the move leaves a model's logits bit for bit as they were and puts every
packed weight, merged Q/K/V and gate/up included, into one 2 MiB-aligned arena
(distinct weights never overlap); each reason for staying on normal pages is
reported as such and moves nothing; the runner says which in `--verbose`.
"""

from __future__ import annotations

import pytest
import torch
from kernel_marks import needs_bf16_paths

from speculant.model.linear import huge_pages
from speculant.model.linear.backend import pack_linear_layers
from speculant.model.linear.dot_linear import dot_linear_unavailable_reason
from speculant.model.linear.huge_pages import (
    HUGE_PAGE,
    huge_pages_unavailable_reason,
    packed_dot_layers,
    place_packed_weights,
)
from speculant.model.linear.merged import merge_sibling_linears
from tiny_models import loaded_tiny_model

DOT_REASON = dot_linear_unavailable_reason(torch.zeros(16, 16, dtype=torch.bfloat16))
needs_kernel = needs_bf16_paths  # tests/kernel_marks.py
needs_thp = pytest.mark.skipif(huge_pages_unavailable_reason() is not None,
                               reason=f"no transparent huge pages: {huge_pages_unavailable_reason()}")


def _packed(arch: str, tmp_path):
    model, ids = loaded_tiny_model(arch, tmp_path)
    model = model.to(torch.bfloat16)
    pack_linear_layers(model, "avx512_bf16")
    merge_sibling_linears(model)
    return model, ids


@needs_kernel
@needs_thp
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_moving_weights_keeps_logits_and_puts_every_weight_in_one_aligned_arena(arch, tmp_path):
    model, ids = _packed(arch, tmp_path)
    with torch.inference_mode():
        want = model(input_ids=ids).logits
        before = [layer.blocked_weight.clone() for layer in packed_dot_layers(model)]
        placement = place_packed_weights(model)
        got = model(input_ids=ids).logits
    layers = packed_dot_layers(model)
    assert placement.reason is None and torch.equal(got, want)
    assert all(torch.equal(layer.blocked_weight, w) for layer, w in zip(layers, before))
    spans = sorted((m.blocked_weight.data_ptr(), m.blocked_weight.numel() * 2) for m in layers)
    base = spans[0][0]
    assert base % HUGE_PAGE == 0, "the arena starts on a huge-page boundary"
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:])), "weights overlap in the arena"
    assert placement.bytes_placed >= sum(n for _, n in spans) and spans[-1][0] + spans[-1][1] <= base + \
        placement.bytes_placed
    # Q/K/V and gate/up of 2 layers merged, o and down, and the LM head
    assert len(layers) == 2 * 4 + 1
    assert "huge pages" in placement.describe()


@needs_kernel
def test_disabled_or_missing_huge_pages_move_nothing(tmp_path, monkeypatch):
    model, _ = _packed("llama", tmp_path)
    pointers = [layer.blocked_weight.data_ptr() for layer in packed_dot_layers(model)]
    monkeypatch.setenv("SPECULANT_HUGE_PAGES", "0")
    placement = place_packed_weights(model)
    assert placement.bytes_placed == 0 and placement.reason == "disabled by SPECULANT_HUGE_PAGES=0"
    assert [layer.blocked_weight.data_ptr() for layer in packed_dot_layers(model)] == pointers
    assert placement.describe() == "packed weights on normal pages: disabled by SPECULANT_HUGE_PAGES=0"


@pytest.mark.parametrize("content, expected", [
    ("always madvise [never]\n", "selects 'never' (needs 'always' or 'madvise')"),
    ("[always] madvise never\n", None),
    ("always [madvise] never\n", None),
])
def test_the_kernel_setting_decides(content, expected, tmp_path, monkeypatch):
    monkeypatch.delenv("SPECULANT_HUGE_PAGES", raising=False)
    monkeypatch.setattr(huge_pages.sys, "platform", "linux")
    setting = tmp_path / "enabled"
    setting.write_text(content)
    monkeypatch.setattr(huge_pages, "THP_SETTING", setting)
    reason = huge_pages_unavailable_reason()
    assert reason is None if expected is None else reason.endswith(expected)
    monkeypatch.setattr(huge_pages, "THP_SETTING", tmp_path / "missing")
    assert "is not readable" in huge_pages_unavailable_reason()
    monkeypatch.setattr(huge_pages.sys, "platform", "darwin")
    assert huge_pages_unavailable_reason() == "transparent huge pages are a Linux feature (platform darwin)"


def test_a_model_without_packed_bf16_weights_says_so(tmp_path):
    model, _ = loaded_tiny_model("llama", tmp_path)  # float32: the dot-product kernel packs nothing
    placement = place_packed_weights(model)
    assert placement.bytes_placed == 0 and "no packed bfloat16 weights" in placement.reason
