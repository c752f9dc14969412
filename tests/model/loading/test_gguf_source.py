"""GGUF checkpoints as model sources (``speculant.model.loading.gguf_source``): a tiny
llama written with gguf-py (Q8_0 linears, byte-level BPE tokenizer, q/k in
llama.cpp's rotary layout) loads and generates like transformers loading the
same file, converted once into a verified, atomically published cache entry."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

pytest.importorskip("gguf")

from greedy_compare import HFReference, check_all_greedy
from speculant import LLM, SamplingParams
from speculant.config.compat import build_config
from speculant.config.models import ConfigError
from speculant.model.loading import gguf_source
from speculant.model.loading.files import ModelFileError
from speculant.model.loading.hf_model import UnsupportedModelError
from tiny_gguf import tiny_llama, write_tiny_gguf

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["def parse(self, text):\n    return", "import os", "x"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory, tokenizer_dir):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf", tokenizer_dir)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache root; the in-process record of private conversions is emptied."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECULANT_CACHE_DIR", str(root))
    monkeypatch.setattr(gguf_source, "_private", {})
    return root


@pytest.fixture
def conversions(monkeypatch):
    """Count calls of the converter (the dequantizing ``from_pretrained``)."""
    calls = []
    real = gguf_source.convert

    def spy(source, out, dtype, option):
        calls.append(source)
        return real(source, out, dtype, option)

    monkeypatch.setattr(gguf_source, "convert", spy)
    return calls


def entries(root):
    folder = root / "gguf"
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


class GGUFReference(HFReference):
    """transformers' own greedy output, loading the GGUF file directly."""

    def __init__(self, path):
        self.model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                          dtype=torch.float32).eval()
        self._cache = {}


def test_writer_round_trips_through_transformers(tmp_path, tokenizer_dir):
    """The test file itself is right: unquantized, transformers reads back the exact model
    (so the q/k rotary permutation and the tensor names match what a llama GGUF holds)."""
    path = write_tiny_gguf(tmp_path / "f32.gguf", tokenizer_dir, quantize=False)
    source, _ = tiny_llama(tokenizer_dir)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 200, 31, 300, 2, 9, 44]])
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, source(ids).logits)


def test_generates_like_transformers_loading_the_gguf(gguf_path, cache):
    # the dequantized conversion is transformers' own model; model.quantization = "gguf" is
    # tested against its kernels' reference in tests/model/loading/test_gguf_quant.py
    llm = LLM(str(gguf_path), max_num_batched_tokens=8, max_num_seqs=4, block_size=4, quantization="dequantize")
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    hf_tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    assert len(outs) == len(PROMPTS)
    for text, out in zip(PROMPTS, outs):
        assert out.prompt_token_ids == hf_tok(text, add_special_tokens=True)["input_ids"]
    ref = GGUFReference(gguf_path)
    check_all_greedy([o.outputs[0].token_ids for o in outs],
                     [ref.greedy(o.prompt_token_ids, GREEDY.max_tokens) for o in outs], "gguf")
    entry = cache / "gguf" / entries(cache)[0]
    assert llm.tokenizer.chat_template == hf_tok.chat_template is not None
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(entry))


def test_directory_plus_gguf_file_is_the_same_source(gguf_path, cache, conversions):
    by_file = gguf_source.resolve_model_source(str(gguf_path), None, "float32")
    by_dir = gguf_source.resolve_model_source(str(gguf_path.parent), gguf_path.name, "float32")
    assert by_file == by_dir and len(conversions) == 1
    # float32, the dtype converted above (model.dtype = "auto" may pick bfloat16: a second conversion)
    llm = LLM(config=build_config({"model": {"path": str(gguf_path.parent), "gguf_file": gguf_path.name,
                                             "dtype": "float32"}}))
    direct = LLM(str(gguf_path), dtype="float32")
    ids = [[5, 17, 200, 31], [300]]
    assert [o.outputs[0].token_ids for o in llm.generate(ids, GREEDY, use_tqdm=False)] == \
           [o.outputs[0].token_ids for o in direct.generate(ids, GREEDY, use_tqdm=False)]
    assert len(conversions) == 1


def test_second_load_reuses_the_cache(gguf_path, cache, conversions):
    first = gguf_source.resolve_model_source(str(gguf_path), None, "float32")
    assert len(conversions) == 1 and entries(cache) == [os.path.basename(first)]
    assert gguf_source.resolve_model_source(str(gguf_path), None, "float32") == first
    os.utime(gguf_path, ns=(0, 1_000_000_000))  # same bytes, new mtime: found again by its hash
    assert gguf_source.resolve_model_source(str(gguf_path), None, "float32") == first
    assert len(conversions) == 1
    marker = json.loads((cache / "gguf" / entries(cache)[0] / gguf_source.MARKER).read_text())
    assert marker["source_sha256"] == gguf_source.sha256_file(gguf_path)
    assert any(s["mtime_ns"] == 1_000_000_000 for s in marker["sources"])
    half = gguf_source.resolve_model_source(str(gguf_path), None, "float16")  # another dtype: its own entry
    assert half != first and len(conversions) == 2 and len(entries(cache)) == 2
    assert json.loads((cache / "gguf" / os.path.basename(half) / "config.json").read_text())["dtype"] == "float16"


def test_changed_file_gets_a_new_entry(tmp_path, tokenizer_dir, cache, conversions):
    path = write_tiny_gguf(tmp_path / "m.gguf", tokenizer_dir, seed=1)
    old = gguf_source.resolve_model_source(str(path), None, "float32")
    write_tiny_gguf(path, tokenizer_dir, seed=2)
    new = gguf_source.resolve_model_source(str(path), None, "float32")
    assert new != old and len(conversions) == 2 and len(entries(cache)) == 2
    assert json.loads((tmp_path / "cache" / "gguf" / os.path.basename(new) / gguf_source.MARKER)
                      .read_text())["source_sha256"] == gguf_source.sha256_file(path)


def _no_marker(entry):
    (entry / gguf_source.MARKER).unlink()


def _garbage_marker(entry):
    (entry / gguf_source.MARKER).write_text("{not json")


def _other_digest(entry):
    data = json.loads((entry / gguf_source.MARKER).read_text())
    data["source_sha256"] = "0" * 64
    (entry / gguf_source.MARKER).write_text(json.dumps(data))


def _truncated_weights(entry):
    with open(entry / "model.safetensors", "r+b") as f:
        f.truncate(1000)


def _group_writable(entry):
    entry.chmod(0o770)


@pytest.mark.parametrize("damage", [_no_marker, _garbage_marker, _other_digest, _truncated_weights,
                                    _group_writable])
def test_damaged_entry_is_not_trusted(gguf_path, cache, conversions, damage):
    entry = gguf_source.resolve_model_source(str(gguf_path), None, "float32")
    damage(cache / "gguf" / os.path.basename(entry))
    again = gguf_source.resolve_model_source(str(gguf_path), None, "float32")
    assert again == entry and len(conversions) == 2  # rebuilt under the same name
    assert gguf_source.entry_problem(cache / "gguf" / os.path.basename(entry),
                                     gguf_source.sha256_file(gguf_path), "float32") is None
    assert [p for p in (cache / "gguf").iterdir() if p.name.startswith(".")] == []  # nothing left over


def test_crash_during_conversion_leaves_nothing_trusted(gguf_path, cache, monkeypatch):
    def crash(source, out, dtype, option):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_source, "convert", crash)
    with pytest.raises(KeyboardInterrupt):
        gguf_source.resolve_model_source(str(gguf_path), None, "float32")
    assert list((cache / "gguf").iterdir()) == []


def test_untrusted_cache_dir_falls_back_to_a_private_dir(gguf_path, cache, conversions):
    cache.mkdir()
    cache.chmod(0o777)
    got = gguf_source.resolve_model_source(str(gguf_path), None, "float32")
    assert not got.startswith(str(cache)) and os.path.isfile(os.path.join(got, "model.safetensors"))
    assert entries(cache) == []
    assert gguf_source.resolve_model_source(str(gguf_path), None, "float32") == got  # once per process
    assert len(conversions) == 1


def test_truncated_file_is_named(gguf_path, tmp_path, cache):
    data = gguf_path.read_bytes()
    for cut in (24, 300, len(data) // 2, len(data) - 1):  # in the header, the metadata, the tensor data
        bad = tmp_path / "cut.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ModelFileError, match=rf"cut\.gguf' \({cut} bytes\).*truncated or corrupt"):
            gguf_source.resolve_model_source(str(bad), None, "float32")
    other = tmp_path / "weights.gguf"
    other.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelFileError, match=r"weights\.gguf.*is not a GGUF file.*b'PK\\x03\\x04'"):
        LLM(str(other))
    assert entries(cache) == []


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_missing_package_names_the_extra(gguf_path, cache, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # `import <package>` now raises ImportError
    with pytest.raises(ImportError, match=rf"tiny-llama\.Q8_0\.gguf.*'{package}' package.*speculant\[gguf\]"):
        LLM(str(gguf_path))
    assert entries(cache) == []


def test_unsupported_architecture_is_named(tmp_path, tokenizer_dir, cache):
    path = write_tiny_gguf(tmp_path / "odd.gguf", tokenizer_dir, architecture="rwkv6")
    with pytest.raises(UnsupportedModelError,
                       match=r"odd\.gguf.*cannot convert.*architecture 'rwkv6'.*rwkv6 is not supported"):
        gguf_source.resolve_model_source(str(path), None, "float32")


def test_undequantizable_type_is_named(tmp_path, tokenizer_dir, cache):
    import gguf

    path = write_tiny_gguf(tmp_path / "q81.gguf", tokenizer_dir,
                           raw_tensor=("blk.0.ffn_up.weight", gguf.GGMLQuantizationType.Q8_1))
    with pytest.raises(UnsupportedModelError, match=r"q81\.gguf.*'Q8_1'.*Q8_1.*original Hugging Face"):
        gguf_source.resolve_model_source(str(path), None, "float32")
    assert entries(cache) == []


def test_source_option_errors(gguf_path, tmp_path):
    with pytest.raises(ConfigError, match=r"model\.gguf_file = 'sub/m\.gguf': give the file name"):
        build_config({"model": {"path": str(tmp_path), "gguf_file": "sub/m.gguf"}})
    with pytest.raises(FileNotFoundError, match=r"needs model\.path to be the directory"):
        gguf_source.resolve_model_source(str(gguf_path), gguf_path.name, "float32")
    with pytest.raises(FileNotFoundError, match=r"'other\.gguf': no such file.*\['tiny-llama\.Q8_0\.gguf'\]"):
        gguf_source.resolve_model_source(str(gguf_path.parent), "other.gguf", "float32")
    with pytest.raises(FileNotFoundError, match=r"no config\.json but holds GGUF files.*set model\.gguf_file"):
        gguf_source.resolve_model_source(str(gguf_path.parent), None, "float32")
    plain = tmp_path / "hf"
    plain.mkdir()
    assert gguf_source.resolve_model_source(str(plain), None, "float32") == str(plain)  # a directory: unchanged


def test_gguf_draft_equals_no_speculation(gguf_path, cache):
    spec = {"proposer": "draft_model", "proposer_options": {"model": str(gguf_path)},
            "num_speculative_tokens": 3}
    ids = [[5, 17, 200, 31], [300, 2, 9]]
    plain = LLM(str(gguf_path)).generate(ids, GREEDY, use_tqdm=False)
    spec_llm = LLM(str(gguf_path), speculative=spec)
    outs = spec_llm.generate(ids, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    assert spec_llm.get_metrics()["acceptance_rate"] == 1.0  # the draft is the target, read from the GGUF
