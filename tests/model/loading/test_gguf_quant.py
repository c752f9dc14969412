"""``model.quantization = "gguf"``: a GGUF checkpoint's quantized tensors stay in their
blocks (``speculant.model.loading.gguf_quant``), on tiny llama files written by the test
in Q4_K, Q6_K, Q8_0, Q4_1 and Q5_0 (one per role), loaded through the real loader."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from speculant import LLM, SamplingParams
from speculant.config.compat import build_config
from speculant.config.models import ConfigError
from speculant.model.linear.quantized import QuantEmbedding, QuantLinear
from speculant.model.loading.gguf_quant import resident_weight_bytes
from tests.kernel_marks import needs_kernel
from tests.model.kernels.quant_blocks import activation_block, quantize_activations
from tiny_gguf import write_tiny_gguf

pytestmark = needs_kernel
HIDDEN = 256  # K-quant rows hold 256 weights
TYPES = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q8_0", "ffn_gate": "Q4_1",
         "ffn_up": "Q5_0", "ffn_down": "Q6_K", "token_embd": "Q6_K", "output": "Q4_K"}
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [300, 12, 44], list(range(40, 57))]


@pytest.fixture(scope="module")
def quant_path(tmp_path_factory, tokenizer_dir):
    return write_tiny_gguf(tmp_path_factory.mktemp("q") / "tiny-mixed.gguf", tokenizer_dir, hidden=HIDDEN,
                           types=TYPES)


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory, tokenizer_dir):
    return write_tiny_gguf(tmp_path_factory.mktemp("qd") / "tiny-draft.gguf", tokenizer_dir, hidden=HIDDEN, seed=7,
                           types={**TYPES, "attn_output": "Q4_K", "ffn_gate": "Q6_K"})


@pytest.fixture(scope="module")
def quant_llm(quant_path):
    # float32 so the reference comparison is not blurred by bfloat16 outputs; the speculative
    # cells below run the default dtype (bfloat16 on CPUs with the fast kernels)
    return LLM(str(quant_path), block_size=4, max_num_batched_tokens=32, max_num_seqs=4, dtype="float32")


def _runner(llm):
    return llm.engine.runner


def test_quantized_layers_compute_the_file_weights_in_their_rows(quant_llm, quant_path):
    """Each kept layer equals 8-bit activations times the dequantized file tensor, rows in
    transformers' order (q/k un-permuted from llama.cpp's rotary layout)."""
    import gguf

    dense = LLM(str(quant_path), block_size=4, quantization="dequantize", dtype="float32")
    reader_model = _runner(dense).model
    model = _runner(quant_llm).model
    report = _runner(quant_llm).quant_report
    assert report is not None and report.notice is None
    assert report.formats == {"Q4_K": 5, "Q6_K": 4, "Q8_0": 2, "Q4_1": 2, "Q5_0": 2}
    assert isinstance(model.get_input_embeddings(), QuantEmbedding)
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(0))
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert len(layers) == 15
    for name, layer in layers.items():
        ref_layer = reader_model.get_submodule(name)
        w = ref_layer.weight.double().numpy()  # transformers' dequantization, in HF row order
        xin = torch.randn(5, layer.in_features, generator=torch.Generator().manual_seed(1))
        ref = quantize_activations(xin.numpy(), activation_block(layer.format.block_elems)) @ w.T
        got = layer(xin).double().numpy()
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), name
    ids = torch.tensor([[3, 0, 299]])
    emb = reader_model.get_input_embeddings()(ids)
    assert torch.allclose(model.get_input_embeddings()(ids), emb, atol=1e-6)
    del x, gguf


def test_resident_weights_stay_within_the_file_size(quant_llm, quant_path):
    model = _runner(quant_llm).model
    total = resident_weight_bytes(model)
    blocks = sum(m.blocks.numel() for m in model.modules() if isinstance(m, QuantLinear))
    assert blocks >= 0.8 * quant_path.stat().st_size  # the bulk of the file stays in its blocks
    assert total <= 1.15 * quant_path.stat().st_size


def test_the_output_layer_keeps_float32_logits_in_a_bfloat16_model(quant_path):
    """In bfloat16 near-equal logits tie (7 of 16 splits from llama.cpp at 1.5B were exact ties), so the
    output layer returns float32: 8-bit activations times the file's weights within float32 error."""
    llm = LLM(str(quant_path), block_size=4, max_num_batched_tokens=32, max_num_seqs=1, dtype="bfloat16")
    model = _runner(llm).model
    head = model.get_output_embeddings()
    assert isinstance(head, QuantLinear) and model.dtype == torch.bfloat16
    dense = _runner(LLM(str(quant_path), block_size=4, quantization="dequantize", dtype="float32")).model
    w = dense.get_output_embeddings().weight.double().numpy()
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(2)).bfloat16()  # [5, hidden] final states
    got = head(x)
    assert got.dtype == torch.float32
    ref = quantize_activations(x.float().numpy(), activation_block(head.format.block_elems)) @ w.T
    assert np.abs(got.double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.fixture(scope="module")
def prompts(default_llm):
    """PROMPTS plus the first random prompt whose greedy continuation repeats an earlier token
    twice, so that the n-gram and suffix proposers have something to propose."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        prompt = torch.randint(1, 300, (10,), generator=gen).tolist()
        out = default_llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        if sum(out[j] in prompt + out[:j] for j in range(len(out) - 1)) >= 2:
            return PROMPTS + [prompt]
    pytest.fail("no prompt gives the n-gram proposer a match")


@pytest.fixture(scope="module")
def default_llm(quant_path):
    return LLM(str(quant_path), block_size=4, max_num_batched_tokens=32, max_num_seqs=4)


@pytest.mark.parametrize("proposer", ["ngram", "suffix", "draft_model"])
def test_speculative_greedy_equals_no_speculation(default_llm, quant_path, draft_path, proposer, prompts):
    base = [o.outputs[0].token_ids for o in default_llm.generate(prompts, GREEDY, use_tqdm=False)]
    options = {"ngram": {"min_n": 1, "max_n": 3}, "suffix": {"max_spec_factor": 3.0, "min_token_prob": 0.0},
               "draft_model": {"model": str(draft_path)}}[proposer]
    llm = LLM(str(quant_path), block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
              speculative={"proposer": proposer, "proposer_options": options, "num_speculative_tokens": 3})
    if proposer == "draft_model":
        draft_runner = llm.engine.proposer.runner if hasattr(llm.engine, "proposer") else None
        if draft_runner is not None:
            assert draft_runner.quant_report is not None and draft_runner.quant_report.num_quantized == 15
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert outs == base
    assert llm.get_metrics()["num_draft_tokens"] > 0


def test_type_without_kernel_is_dequantized_with_one_notice(tmp_path, tokenizer_dir, caplog):
    path = write_tiny_gguf(tmp_path / "q5_1.gguf", tokenizer_dir, hidden=HIDDEN,
                           types={**TYPES, "ffn_up": "Q5_1"})
    with caplog.at_level(logging.WARNING, logger="speculant.model.loading.gguf_quant"):
        llm = LLM(str(path), block_size=4)
    report = _runner(llm).quant_report
    assert report.formats == {"Q4_K": 5, "Q6_K": 4, "Q8_0": 2, "Q4_1": 2}
    lines = [r.getMessage() for r in caplog.records if "model.quantization" in r.getMessage()]
    assert lines == ["model.quantization = 'gguf': 2 tensor(s) dequantized because type Q5_1 has no kernel "
                     "(e.g. blk.0.ffn_up.weight)"]
    assert len(llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


def test_without_the_c_kernels_everything_is_dequantized_with_a_notice(quant_path, monkeypatch, caplog):
    from speculant.model.linear import quantized

    monkeypatch.setattr(quantized, "quant_kernel_unavailable_reason", lambda: "no C compiler (test)")
    with caplog.at_level(logging.WARNING, logger="speculant.model.loading.gguf_quant"):
        llm = LLM(str(quant_path), block_size=4)
    assert not any(isinstance(m, (QuantLinear, QuantEmbedding)) for m in _runner(llm).model.modules())
    assert [r.getMessage() for r in caplog.records if "model.quantization" in r.getMessage()] == [
        "model.quantization = 'gguf': every tensor stays dequantized: no C compiler (test)"]
    assert len(llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


def test_dequantize_keeps_the_dense_path(quant_path):
    llm = LLM(str(quant_path), block_size=4, quantization="dequantize")
    assert _runner(llm).quant_report is None
    assert not any(isinstance(m, QuantLinear) for m in _runner(llm).model.modules())


def test_bad_quantization_value_is_refused():
    with pytest.raises(ConfigError) as err:
        build_config({"model": {"path": "x", "quantization": "int4"}})
    assert "model.quantization" in str(err.value) and "'gguf'" in str(err.value) and "'dequantize'" in str(err.value)


def test_the_tensor_reader_matches_gguf_py(quant_path, tmp_path):
    """``GGUFTensors`` (which skips the tokenizer arrays) gives gguf-py's tensors, bytes and scalar fields."""
    import gguf

    from speculant.model.loading.gguf_tensors import GGUFTensors

    ours, theirs = GGUFTensors(quant_path), gguf.GGUFReader(quant_path)
    assert [(t.name, t.tensor_type) for t in ours.tensors] == [(t.name, t.tensor_type) for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.data.shape == b.data.shape and np.array_equal(a.data, b.data), a.name
    assert ours.fields["general.architecture"].contents() == theirs.fields["general.architecture"].contents()
    assert "tokenizer.ggml.tokens" not in ours.fields  # arrays are stepped over
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match=r"bad.gguf: not a GGUF file \(its first bytes are b'GGML', not b'GGUF'\)"):
        GGUFTensors(bad)
