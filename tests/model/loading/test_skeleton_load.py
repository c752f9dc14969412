"""The skeleton load of a GGUF kept quantized (``speculant.model.loading.skeleton``) gives the model
the full load gives (dense conversion first, then ``keep_quantized``): the same modules, the same
tensors bit for bit, the same logits, while the dense weights it replaces are never read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from speculant import LLM
from speculant.interfaces.span_tensors import PagedSpan
from speculant.model import runner as runner_module
from speculant.model.linear.quantized import QuantEmbedding, QuantLinear
from speculant.model.loading import skeleton
from speculant.model.loading.gguf_quant import resident_weight_bytes
from speculant.model.loading.skeleton import SkeletonMiss
from tests.kernel_marks import needs_kernel
from tiny_gguf import write_tiny_gguf

pytestmark = needs_kernel
HIDDEN = 256
TYPES = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q8_0", "ffn_gate": "Q4_1",
         "ffn_up": "Q5_0", "ffn_down": "Q6_K", "token_embd": "Q6_K", "output": "Q4_K"}
TOKENS = [5, 6, 7, 8, 300, 12, 44, 9, 1, 2, 3]


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory, tokenizer_dir):
    return write_tiny_gguf(tmp_path_factory.mktemp("sk") / "tiny-mixed.gguf", tokenizer_dir, hidden=HIDDEN,
                           types=TYPES)


def _full_load(monkeypatch):
    """Make the runner take the full path, as a model whose checkpoint names differ would."""
    def miss(*args, **kwargs):
        raise SkeletonMiss("forced by the test")
    monkeypatch.setattr(runner_module, "load_kept_quantized", miss)


def _llm(path, dtype):
    return LLM(str(path), block_size=4, max_num_batched_tokens=32, max_num_seqs=2, dtype=dtype)


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}


def _logits(llm) -> torch.Tensor:
    runner = llm.engine.runner
    table = runner.scratch_tables([len(TOKENS)])[0]
    return runner.forward([PagedSpan(table, 0, TOKENS, list(range(len(TOKENS))))]).logits  # [T, V]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_skeleton_load_equals_the_full_load(gguf_path, monkeypatch, dtype):
    fast = _llm(gguf_path, dtype)
    with monkeypatch.context() as m:
        _full_load(m)
        full = _llm(gguf_path, dtype)
    a, b = fast.engine.runner.model, full.engine.runner.model
    assert [(n, type(x)) for n, x in a.named_modules()] == [(n, type(x)) for n, x in b.named_modules()]
    assert isinstance(a.get_input_embeddings(), QuantEmbedding)
    assert sum(isinstance(x, QuantLinear) for x in a.modules()) == 15
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    for name, t in ta.items():
        assert t.device.type == "cpu" and t.dtype == tb[name].dtype and torch.equal(t, tb[name]), name
    assert fast.engine.runner.quant_report.formats == full.engine.runner.quant_report.formats
    assert torch.equal(_logits(fast), _logits(full))
    assert resident_weight_bytes(a) == resident_weight_bytes(b) <= 1.15 * gguf_path.stat().st_size


def test_replaced_weights_are_never_read(gguf_path, monkeypatch):
    """Only sampled rows of a quantized layer's converted weight are read (the layout check),
    every other tensor at most once."""
    reads: list[str] = []
    tensor = skeleton.CheckpointTensors.tensor

    def counted(self, name):
        reads.append(name)
        return tensor(self, name)
    monkeypatch.setattr(skeleton.CheckpointTensors, "tensor", counted)
    model = _llm(gguf_path, "float32").engine.runner.model
    assert len(reads) == len(set(reads))
    assert not [n for n in reads if n.endswith("_proj.weight") or "embed_tokens" in n or "lm_head" in n]
    assert {n for n in reads} == {n for n, _ in model.named_parameters()}  # the norms


def test_a_layer_left_dequantized_is_read_whole(tmp_path, tokenizer_dir, monkeypatch):
    """A type without a kernel stays a dense layer: the skeleton reads its converted weight, and the
    model equals the full load's."""
    import gguf

    path = write_tiny_gguf(tmp_path / "tiny-q8.gguf", tokenizer_dir, hidden=HIDDEN,
                           types={**TYPES, "ffn_up": "Q5_1"})
    fast = _llm(path, "float32")
    report = fast.engine.runner.quant_report
    assert list(report.dequantized) == ["type Q5_1 has no kernel"]
    with monkeypatch.context() as m:
        _full_load(m)
        full = _llm(path, "float32")
    ta, tb = _tensors(fast.engine.runner.model), _tensors(full.engine.runner.model)
    assert ta.keys() == tb.keys() and all(torch.equal(t, tb[n]) for n, t in ta.items())
    up = fast.engine.runner.model.get_submodule("model.layers.0.mlp.up_proj")
    assert type(up) is not QuantLinear and up.weight.device.type == "cpu"
    del gguf


def test_a_parameter_missing_from_the_conversion_is_a_miss(gguf_path):
    from speculant.model.loading.gguf_source import resolve_model_source
    from speculant.model.loading.hf_model import load_hf_model

    source = resolve_model_source(str(gguf_path), None, "float32")
    model, _ = load_hf_model(source, "float32", torch.device("cpu"), None, skeleton=True)
    tensors = skeleton.CheckpointTensors(Path(source))
    model.model.norm.register_parameter("extra", torch.nn.Parameter(torch.ones(3, device="meta")))
    with pytest.raises(SkeletonMiss, match=r"no tensor for parameter 'model\.norm\.extra'"):
        skeleton.materialise(model, tensors)


def test_the_model_keeps_its_own_copy_of_the_blocks(tmp_path, tokenizer_dir):
    """Blocks are copied out of the mapped file (repacked or not): the file overwritten in place after
    the load changes nothing."""
    path = write_tiny_gguf(tmp_path / "tiny-own.gguf", tokenizer_dir, hidden=HIDDEN, types=TYPES)
    llm = _llm(path, "float32")
    before = _logits(llm)
    size = path.stat().st_size
    with open(path, "r+b") as f:  # same inode: a mapping of it would see the new bytes
        f.seek(size // 10)
        f.write(b"\x00" * (size - size // 10))
    assert torch.equal(_logits(llm), before)
