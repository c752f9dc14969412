"""Tests for speculant.model.linear.backend: packed linears equal the unpacked ones.

Tolerances, relative to the largest reference output:
* float32: 1e-5. Packed and default paths differ only in summation order
  (~1e-6 relative measured); any layout bug gives errors of order 1.
* bfloat16: 2^-6. Both paths round float32 accumulators to bfloat16, so one
  rounding step (one ulp, 2^-7 relative) may differ per layer.
"""

from __future__ import annotations

import pytest
import torch
from kernel_marks import require_bf16_paths
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.pytorch_utils import Conv1D

from speculant.model.linear.backend import (
    LinearBackendError,
    OneDNNLinear,
    pack_linear_layers,
)
from speculant.model.linear.dot_linear import DotLinear, dot_linear_unavailable_reason
from speculant.model.linear.packed import PackedLinear

requires_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(),
    reason="this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)",
)
DOT_REASON = dot_linear_unavailable_reason(torch.zeros(16, 16, dtype=torch.bfloat16))
"""Why this machine cannot run the bfloat16 dot-product kernel (None: it can)."""
KINDS = {"onednn": OneDNNLinear, "avx512_bf16": DotLinear}
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6}
NUM_LLAMA_LINEARS = 2 * 7 + 1  # per layer q, k, v, o, gate, up, down; plus lm_head


def tiny_llama(tie: bool, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A random 2-layer Llama (hidden 64, GQA 4/2 heads, vocab 256) on the CPU."""
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, tie_word_embeddings=tie, initializer_range=0.2,
    )
    return LlamaForCausalLM(config).eval().to(dtype)


def assert_close_to_scale(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """max |got - ref| <= TOLERANCE[dtype] * max |ref|."""
    assert got.shape == ref.shape
    error = (got.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    assert error <= TOLERANCE[dtype] * scale, f"error {error:.3e} vs scale {scale:.3e}"


@requires_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tie", [True, False])
def test_llama_logits_match_unpacked(tie: bool, dtype: torch.dtype) -> None:
    model = tiny_llama(tie, dtype)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    embedding = model.model.embed_tokens.weight
    embedding_before = embedding.detach().clone()
    ids = torch.randint(0, 256, (1, 11), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids).logits  # [1, 11, 256]
        report = pack_linear_layers(model, "auto")
        got = model(ids).logits
    # auto: the dot-product kernel for bfloat16 where the CPU has it, else oneDNN
    kind = "avx512_bf16" if dtype == torch.bfloat16 and DOT_REASON is None else "onednn"
    assert report.backend == kind
    assert report.num_packed == NUM_LLAMA_LINEARS and report.num_default == 0
    assert type(model.lm_head) is KINDS[kind]
    assert_close_to_scale(got, ref, dtype)
    # The embedding keeps its own weight; a tied lm_head costs one extra packed copy.
    assert model.model.embed_tokens.weight is embedding
    assert torch.equal(embedding, embedding_before)
    lm_head_bytes = 256 * 64 * dtype.itemsize
    assert report.extra_bytes == (lm_head_bytes if tie else 0)


@requires_onednn
def test_gpt2_conv1d_layers_are_packed_and_exact() -> None:
    torch.manual_seed(0)
    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids).logits  # [1, 9, 256]
        report = pack_linear_layers(model, "onednn")
        got = model(ids).logits
    assert report.num_packed == 2 * 4 + 1  # c_attn, attn c_proj, c_fc, mlp c_proj; lm_head
    assert not any(isinstance(m, Conv1D) for m in model.modules())
    assert_close_to_scale(got, ref, torch.float32)


@requires_onednn
@pytest.mark.parametrize("backend, dtype", [("onednn", torch.float32), ("onednn", torch.bfloat16),
                                            ("avx512_bf16", torch.bfloat16)])
@pytest.mark.parametrize("lead", [(1,), (7,), (33,), (1, 1), (1, 7), (2, 5)])
def test_bias_and_no_bias_layers_any_leading_dims(lead: tuple[int, ...], backend: str, dtype) -> None:
    if backend == "avx512_bf16" and DOT_REASON is not None:
        require_bf16_paths()
    torch.manual_seed(0)
    # Sizes off oneDNN's 16/64 blocking, so padding paths are exercised.
    model = nn.Sequential(nn.Linear(300, 520, bias=True), nn.Linear(520, 300, bias=False))
    model = model.to(dtype)
    x = torch.randn(*lead, 300).to(dtype)  # [*lead, 300]
    with torch.no_grad():
        ref = model(x)  # [*lead, 300]
        report = pack_linear_layers(model, backend)
        got = model(x)
    assert report.num_packed == 2 and report.backend == backend
    assert all(type(m) is KINDS[backend] for m in model)
    assert model[0].bias is not None and model[1].bias is None
    assert_close_to_scale(got, ref, dtype)


@requires_onednn
def test_dense_max_rows_runs_few_rows_on_the_dense_weight() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 520), nn.Linear(520, 300, bias=False))
    few, many = torch.randn(1, 3, 300), torch.randn(1, 4, 300)  # [1, T, in]
    with torch.no_grad():
        ref_few, ref_many = model(few), model(many)
        report = pack_linear_layers(model, "onednn", dense_max_rows=3)
        got_few, got_many = model(few), model(many)
        packed_few = model[1].packed_forward(model[0].packed_forward(few))
        packed_many = model[1].packed_forward(model[0].packed_forward(many))
    # Up to 3 rows: the very F.linear calls the unpacked model made, so bit-identical.
    assert torch.equal(got_few, ref_few)
    assert torch.equal(got_many, packed_many)
    assert_close_to_scale(got_many, ref_many, torch.float32)
    assert_close_to_scale(packed_few, ref_few, torch.float32)
    assert report.freed_bytes == 0 and report.extra_bytes == (300 * 520 * 2) * 4
    with pytest.raises(ValueError, match="dense_max_rows must be >= 0"):
        pack_linear_layers(model, "onednn", dense_max_rows=-1)


@requires_onednn
def test_dense_max_rows_is_ignored_for_bfloat16() -> None:
    model = nn.Sequential(nn.Linear(64, 64)).to(torch.bfloat16)
    report = pack_linear_layers(model, "onednn", dense_max_rows=3)
    assert model[0].dense_weight is None
    assert report.extra_bytes == 0


@requires_onednn
def test_dense_weight_view_is_exact() -> None:
    layer = nn.Linear(40, 24)
    weight = layer.weight.detach().clone()
    packed = OneDNNLinear(layer.weight, layer.bias)
    assert torch.equal(packed.weight, weight)


@requires_onednn
def test_onednn_on_float64_is_a_clear_error() -> None:
    model = tiny_llama(tie=False, dtype=torch.float64)
    with pytest.raises(LinearBackendError) as excinfo:
        pack_linear_layers(model, "onednn")
    message = str(excinfo.value)
    for part in ("model.linear_backend = 'onednn'", "float64", "float32 and bfloat16",
                 "'auto'", "model.dtype"):
        assert part in message, (part, message)
    assert not any(isinstance(m, OneDNNLinear) for m in model.modules())


def test_auto_on_float64_packs_nothing() -> None:
    model = tiny_llama(tie=True, dtype=torch.float64)
    report = pack_linear_layers(model, "auto")
    assert report.backend == "default"
    assert report.num_packed == 0 and report.extra_bytes == 0
    assert report.num_default == NUM_LLAMA_LINEARS
    assert not any(isinstance(m, OneDNNLinear) for m in model.modules())


def test_default_backend_packs_nothing() -> None:
    model = tiny_llama(tie=False)
    report = pack_linear_layers(model, "default")
    assert report.backend == "default" and report.num_packed == 0
    assert report.num_default == NUM_LLAMA_LINEARS
    assert type(model.lm_head) is nn.Linear


def test_unknown_backend_lists_the_choices() -> None:
    with pytest.raises(LinearBackendError, match="'auto', 'default', 'onednn', 'avx512_bf16'"):
        pack_linear_layers(nn.Linear(4, 4), "mkl")


@requires_onednn
@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch's own note from flags()
def test_onednn_disabled_is_a_clear_error() -> None:
    model = nn.Sequential(nn.Linear(8, 8))
    with torch.backends.mkldnn.flags(enabled=False):
        with pytest.raises(LinearBackendError, match="torch.backends.mkldnn.enabled is False"):
            pack_linear_layers(model, "onednn")
        assert pack_linear_layers(model, "auto").num_packed == 0


def test_missing_onednn_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    model = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(LinearBackendError, match=r"no oneDNN .*model.linear_backend = 'auto'"):
        pack_linear_layers(model, "onednn")
    report = pack_linear_layers(model, "auto")
    assert report.backend == "default" and "no oneDNN" in report.reason
    assert type(model[0]) is nn.Linear


@requires_onednn
def test_onednn_off_cpu_is_a_clear_error() -> None:
    model = nn.Sequential(nn.Linear(8, 8, device="meta"))
    with pytest.raises(LinearBackendError, match="layer '0': weights are on meta.*CPU-only"):
        pack_linear_layers(model, "onednn")
    assert pack_linear_layers(model, "auto").num_packed == 0


@requires_onednn
def test_packing_twice_is_idempotent() -> None:
    model = tiny_llama(tie=True)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(2))
    first = pack_linear_layers(model, "auto")
    with torch.inference_mode():
        once = model(ids).logits
    second = pack_linear_layers(model, "auto")
    assert first.num_packed == NUM_LLAMA_LINEARS
    assert second.num_packed == 0 and second.num_already_packed == NUM_LLAMA_LINEARS
    assert second.backend == "onednn" and second.extra_bytes == 0
    for module in model.modules():
        if isinstance(module, PackedLinear):
            assert not any(isinstance(c, (PackedLinear, nn.Linear)) for c in module.children())
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, once)


@requires_onednn
@pytest.mark.parametrize("pack_mode", ["inference_mode", "no_grad"])
@pytest.mark.parametrize("run_mode", ["inference_mode", "no_grad"])
def test_pack_and_run_under_either_grad_mode(pack_mode: str, run_mode: str) -> None:
    modes = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}
    layer = nn.Linear(32, 48)
    x = torch.randn(1, 3, 32)  # [1, T, in]
    with torch.no_grad():
        ref = layer(x)
    model = nn.Sequential(layer)
    with modes[pack_mode]():
        assert pack_linear_layers(model, "onednn").num_packed == 1
    with modes[run_mode]():
        got = model(x)
    assert_close_to_scale(got, ref, torch.float32)


@requires_onednn
def test_layer_held_by_two_parents_is_packed_once() -> None:
    shared = nn.Linear(16, 16)
    model = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    report = pack_linear_layers(model, "onednn")
    assert report.num_packed == 1
    assert isinstance(model["a"][0], OneDNNLinear) and model["a"][0] is model["b"][0]


@requires_onednn
def test_failed_probe_keeps_the_default_path(monkeypatch: pytest.MonkeyPatch) -> None:
    exact_forward = OneDNNLinear.packed_forward
    monkeypatch.setattr(OneDNNLinear, "packed_forward", lambda m, x: exact_forward(m, x) * 1.01)
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    with pytest.warns(RuntimeWarning, match="2 linear layer.s. stay on the default path"):
        report = pack_linear_layers(model, "auto")
    assert report.backend == "default" and report.num_default == 2
    assert "tolerance" in report.reason
    assert all(type(m) is nn.Linear for m in model)



@pytest.mark.parametrize("vendor, weight_mib, rows", [
    ("GenuineIntel", 50, 8), ("GenuineIntel", 500, 3), ("GenuineIntel", 4096, 0),
    ("AuthenticAMD", 50, 0), ("AuthenticAMD", 500, 0), ("", 50, 0),
])
def test_auto_dense_rows_by_cpu_vendor_and_model_size(vendor, weight_mib, rows) -> None:
    from speculant.model.runner import auto_dense_max_rows
    assert auto_dense_max_rows(weight_mib << 20, vendor) == rows
