"""A GGUF whose every tensor is a block-of-32 format (Q4_0, Q4_1, Q5_0, Q8_0), as the 0.5B draft
(mostly Q5_0 and Q8_0) and SmolLM2's Q4_1 file are, kept quantized: repacked in groups of 16
rows where the AVX-512 VNNI path runs (``csrc/quant_repack_b32.c``). The hidden width, 96, is
3 blocks: an odd block count, so the repacked sections do not start on 64-byte lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from speculant import LLM, SamplingParams
from speculant.model.linear.quantized import QuantEmbedding, QuantLinear, kernel_isa
from speculant.model.loading.gguf_quant import resident_weight_bytes
from tests.kernel_marks import needs_kernel
from tests.model.kernels.quant_blocks import quantize_activations
from tiny_gguf import write_tiny_gguf

pytestmark = needs_kernel
HIDDEN = 96
TYPES = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_0", "ffn_gate": "Q4_1",
         "ffn_up": "Q5_0", "ffn_down": "Q4_1", "token_embd": "Q5_0", "output": "Q8_0"}
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [300, 12, 44], list(range(40, 57)), [9, 9, 9, 9]]


DRAFT_TYPES = {**TYPES, "attn_q": "Q8_0", "ffn_gate": "Q5_0"}


@pytest.fixture(scope="module")
def files(tmp_path_factory, tokenizer_dir):
    """The target's and the draft's GGUF paths (the draft from another seed, other types in two roles)."""
    folder = tmp_path_factory.mktemp("b32")
    return [write_tiny_gguf(folder / f"{name}.gguf", tokenizer_dir, hidden=HIDDEN, seed=seed, types=types)
            for name, seed, types in (("target", 0, TYPES), ("draft", 5, DRAFT_TYPES))]


@pytest.fixture(scope="module")
def target_path(files):
    return files[0]


@pytest.fixture(scope="module")
def plain_llm(target_path):
    return LLM(str(target_path), block_size=4, max_num_batched_tokens=32, max_num_seqs=4)


def test_every_layer_is_kept_in_its_block_format_and_computes_the_file_weights(target_path):
    """Each layer equals 8-bit activations (blocks of 32) times the file's tensor as transformers
    dequantizes it; on the VNNI path each is held repacked, and the resident weights stay within
    1.15x the file."""
    llm = LLM(str(target_path), block_size=4, max_num_batched_tokens=32, max_num_seqs=1, dtype="float32")
    model = llm.engine.runner.model
    assert llm.engine.runner.quant_report.formats == {"Q5_0": 6, "Q8_0": 3, "Q4_0": 2, "Q4_1": 4}
    dense = LLM(str(target_path), block_size=4, quantization="dequantize", dtype="float32").engine.runner.model
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert len(layers) == 15
    for name, layer in layers.items():
        assert layer.format.name.endswith("_X16") == (kernel_isa() == "avx512_vnni"), (name, layer.format.name)
        w = dense.get_submodule(name).weight.double().numpy()
        x = torch.randn(7, layer.in_features, generator=torch.Generator().manual_seed(3))
        ref = quantize_activations(x.numpy(), 32) @ w.T
        got = layer(x).double().numpy()
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), name
    ids = torch.tensor([[3, 0, 299, 17]])
    assert isinstance(model.get_input_embeddings(), QuantEmbedding)
    assert torch.allclose(model.get_input_embeddings()(ids), dense.get_input_embeddings()(ids), atol=1e-6)
    assert resident_weight_bytes(model) <= 1.15 * target_path.stat().st_size


@pytest.mark.parametrize("proposer", ["ngram", "draft_model"])
def test_speculative_greedy_equals_no_speculation(plain_llm, files, proposer):
    """Verify rows get the bits a one-row decode gets (the group kernels are row-invariant), so
    speculation changes no token; the draft model is a block-of-32 file too."""
    base = [o.outputs[0].token_ids for o in plain_llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    target_path, draft_path = files
    options = {"ngram": {"min_n": 1, "max_n": 3}, "draft_model": {"model": str(draft_path)}}[proposer]
    llm = LLM(str(target_path), block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
              speculative={"proposer": proposer, "proposer_options": options, "num_speculative_tokens": 4})
    outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert outs == base
    assert llm.get_metrics()["num_draft_tokens"] > 0
