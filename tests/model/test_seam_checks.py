"""The load-time checks of the attention seam, on their own: the probe's
reading of attention calls, and the self-test that refuses a model whose
logits through the engine differ from transformers' own attention."""

from __future__ import annotations

import pytest
import torch
from kernel_marks import require_bf16_paths, require_kernel

from speculant import LLM
from speculant.model import runner as model_runner
from speculant.model.attention.seam_probe import AttentionCall, seam_refusals
from speculant.model.attention.torch_ref import TorchAttentionBackend
from speculant.model.loading.hf_model import UnsupportedModelError


def call(layer, kv_len=3, **kwargs) -> AttentionCall:
    return AttentionCall(layer=layer, query_shape=(1, 4, 3, 16), key_shape=(1, 2, kv_len, 16),
                         value_shape=(1, 2, kv_len, 16), is_causal=True, has_mask=False,
                         kwargs={"dropout": 0.0, "scaling": 0.25, "position_ids": None, **kwargs})


def test_plain_causal_calls_pass():
    assert seam_refusals([call(0), call(1)], num_layers=2, max_model_len=64) == []


@pytest.mark.parametrize("calls, num_layers, words", [
    ([call(0, sliding_window=16), call(1)], 2, "sliding-window attention (window 16 < max_model_len 64)"),
    ([call(0, softcap=30.0), call(1)], 2, "soft-capping (softcap=30.0)"),
    ([call(0, sinks=torch.zeros(4)), call(1)], 2, "attention sinks"),
    ([call(0, kv_len=5), call(1)], 2, "keys of a different length than the queries"),
    ([call(0, alibi_slopes=torch.zeros(4)), call(1)], 2, "`alibi_slopes` = Tensor"),
    ([call(0, is_causal=False), call(1)], 2, "non-causal"),
    ([call(1)], 2, "1 of 2 layers never call attention"),
    ([call(0), call(0)], 1, "more than once per forward"),
    ([], 2, "no layer called transformers' attention interface"),
], ids=["window", "softcap", "sinks", "cross", "unknown-argument", "bidirectional", "hybrid", "twice", "none"])
def test_probe_refuses_each_feature_by_name(calls, num_layers, words):
    problems = seam_refusals(calls, num_layers=num_layers, max_model_len=64)
    assert any(words in p for p in problems), problems


def test_window_no_sequence_can_outgrow_is_accepted():
    assert seam_refusals([call(0, sliding_window=64), call(1, sliding_window=None)], 2, max_model_len=64) == []


class SkewedBackend(TorchAttentionBackend):
    """Right everywhere except that decodes see their keys scaled: the kind of
    subtle backend fault no argument check can see."""

    name = "skewed"

    def attend_spans(self, query, key_cache, value_cache, views, scaling, out):
        super().attend_spans(query, key_cache, value_cache, views, scaling * 1.5, out)


def test_self_test_refuses_a_model_the_engine_would_get_wrong(llama_dir):
    from speculant.config.models import CacheConfig, ModelConfig

    with pytest.raises(UnsupportedModelError, match=r"backend 'skewed'\) differ from transformers' own"):
        model_runner.ModelRunner(ModelConfig(path=str(llama_dir)), CacheConfig(num_blocks=64), SkewedBackend())


def test_self_test_passes_and_records_its_deviation(llama_dir):
    llm = LLM(str(llama_dir), max_num_batched_tokens=64)
    assert 0.0 <= llm.engine.runner.self_test_deviation < 1e-4
    # the test sequences' blocks went back to the pool
    manager = llm.engine.blocks
    assert manager.num_free_blocks == manager.num_blocks


def test_a_pool_larger_than_memory_is_refused_before_allocating(llama_dir):
    with pytest.raises(ValueError, match=r"cache.num_blocks = 4000000: the KV cache needs .* GiB .* lower "
                                         r"cache.num_blocks to at most"):
        LLM(str(llama_dir), num_blocks=4_000_000, block_size=1024)


# --- bfloat16: each path against an upcast reference, layer by layer -------------------------

@pytest.fixture(scope="module")
def deep_bf16_dir(tmp_path_factory, tokenizer_dir):
    """40 layers with large weights: in bfloat16 the engine's float32-softmax kernel and transformers'
    bf16-rounded eager attention drift apart over the depth as a real 28-layer model does."""
    from tiny_models import build_model

    return build_model("llama", tmp_path_factory.mktemp("deep"), tokenizer_dir, layers=40, init_std=0.5)


def _runner(path, backend, dtype="bfloat16"):
    from speculant.config.models import CacheConfig, ModelConfig

    return model_runner.ModelRunner(ModelConfig(path=str(path), dtype=dtype), CacheConfig(num_blocks=64), backend)


@pytest.mark.parametrize("backend", ["cpu_kernel/avx512_bf16", "cpu_kernel/scalar", "torch"])
def test_two_correct_bf16_paths_that_drift_apart_are_accepted(backend, deep_bf16_dir):
    """Each bf16 instruction path of the C kernel (forced: the CPU's own choice is one of them),
    and the torch reference backend."""
    from speculant.model.attention.cpu_kernel import CpuKernelAttentionBackend
    from speculant.model.attention.hf_seam import SEAM_NAME
    from speculant.model.kernels.build import load_kernel, set_kernel_isa
    from speculant.model.seam_selftest import RATIO, SeamSelfTestError, _logits_test, _test_sequences

    path = backend.partition("/")[2]
    if path:
        require_kernel()
        if path == "avx512_bf16":
            require_bf16_paths()
        set_kernel_isa(load_kernel(), path)
    try:
        runner = _runner(deep_bf16_dir, CpuKernelAttentionBackend() if path else TorchAttentionBackend())
        result = runner.self_test
        assert result.transformers_error is not None
        assert 0 < result.engine_error <= RATIO * result.transformers_error
        if path:  # the old whole-model comparison of the two bf16 paths refused this model
            with pytest.raises(SeamSelfTestError, match=r"differ from transformers' own 'eager' attention by 0\.1"):
                _logits_test(runner, SEAM_NAME, _test_sequences(runner))
    finally:
        if path:
            set_kernel_isa(load_kernel(), None)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_wrong_seam_is_still_refused_layer_by_layer(dtype, deep_bf16_dir):
    with pytest.raises(UnsupportedModelError, match=r"backend 'skewed'\) differ from transformers' own 'eager' "
                                                    r"attention's by more than .* rounding explains: at layer \d+, "
                                                    r"on the same input, the engine's token \d+ is off"):
        _runner(deep_bf16_dir, SkewedBackend(), dtype)


def test_models_without_a_layer_list_compare_whole_logits(llama_dir, monkeypatch):
    from speculant.model import seam_selftest

    monkeypatch.setattr(seam_selftest, "decoder_layers", lambda model: None)
    result = _runner(llama_dir, TorchAttentionBackend(), "float32").self_test
    assert result.transformers_error is None and result.engine_error < 1e-4
    with pytest.raises(UnsupportedModelError, match=r"logits through speculant's paged attention \(backend 'skewed'"):
        _runner(llama_dir, SkewedBackend(), "float32")


def test_the_upcast_reference_puts_every_weight_back_bit_for_bit(llama_dir):
    from speculant.model.attention.cpu_kernel import CpuKernelAttentionBackend
    from speculant.model.layer_reference import decoder_layers, upcast_layer

    runner = _runner(llama_dir, CpuKernelAttentionBackend())
    layer = decoder_layers(runner.model)[0]
    before = {k: (v.dtype, v.clone()) for k, v in layer.state_dict().items()}
    modules = {name: type(m) for name, m in layer.named_modules()}
    with upcast_layer(layer, torch.float32) as up:
        assert all(p.dtype == torch.float32 for p in up.parameters())
    after = layer.state_dict()
    assert {name: type(m) for name, m in layer.named_modules()} == modules
    assert before.keys() == after.keys()
    assert all(after[k].dtype == dt and torch.equal(after[k], v) for k, (dt, v) in before.items())
