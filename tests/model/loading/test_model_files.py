"""Broken model files and mismatched drafts: each is refused with the file or
option named, what is wrong and the fix, from the Python API and as one
line (no traceback) from the CLI."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from speculant import LLM
from speculant.cli import main
from speculant.model.loading import hf_model as model_loading
from speculant.model.loading.files import ModelFileError, check_safetensors_file, check_weight_files

pytestmark = pytest.mark.usefixtures("one_thread")

FIX = "re-download the model or save it again with model.save_pretrained()"


@pytest.fixture
def model_copy(llama_dir, tmp_path) -> Path:
    return Path(shutil.copytree(llama_dir, tmp_path / "model"))


def weights(model_dir: Path) -> Path:
    return model_dir / "model.safetensors"


def header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return n, json.loads(raw[8:8 + n])


def rewrite_header(path: Path, change) -> None:
    raw = path.read_bytes()
    n, head = header(path)
    change(head)
    text = json.dumps(head).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def test_a_good_file_passes(llama_dir):
    n, head = header(weights(llama_dir))
    count = len([k for k in head if k != "__metadata__"])
    assert check_safetensors_file(weights(llama_dir)) == count > 0
    assert check_weight_files(llama_dir) == [weights(llama_dir)]


CORRUPTIONS = {
    # name: (change to the file, words)
    "truncated-data": (lambda p: p.write_bytes(p.read_bytes()[:-100]), ["is truncated: tensor", "data bytes"]),
    "truncated-header": (lambda p: p.write_bytes(p.read_bytes()[:50]), ["is truncated: the header needs"]),
    "empty": (lambda p: p.write_bytes(b""), ["is truncated: 0 bytes"]),
    "garbage-length": (lambda p: p.write_bytes(b"\xff" * 64), ["is not a safetensors file", "header length"]),
    "bad-json": (lambda p: p.write_bytes(p.read_bytes()[:9] + b"#" + p.read_bytes()[10:]),
                 ["has a corrupt header (not valid UTF-8 JSON"]),
    "offsets-past-end": (lambda p: rewrite_header(p, lambda h: h[next(k for k in h if k != "__metadata__")]
                                                  .update(data_offsets=[0, 10**12])),
                         ["is truncated: tensor", "ends at data byte 1000000000000"]),
    "shape-mismatch": (lambda p: rewrite_header(p, lambda h: h[next(k for k in h if k != "__metadata__")]
                                                .update(shape=[1, 1])),
                       ["is corrupt: tensor", "F32 [1, 1]) needs 4 bytes"]),
    "entry-not-a-tensor": (lambda p: rewrite_header(p, lambda h: h.clear() or h.update(x=[1])),
                           ["corrupt header entry for tensor 'x'"]),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupt_weights_are_named_at_load(name, model_copy):
    change, words = CORRUPTIONS[name]
    change(weights(model_copy))
    with pytest.raises(ModelFileError) as err:
        LLM(str(model_copy))
    message = str(err.value)
    for w in ["model.path", f"weight file {str(weights(model_copy))!r}", FIX, *words]:
        assert w in message, f"{w!r} missing from:\n{message}"


def test_missing_shard_named_by_the_index(model_copy):
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFileError, match="names shard\\(s\\) that do not exist: model-00002-of-00002"):
        check_weight_files(model_copy)


def test_safetensors_error_that_slips_through_names_the_directory(model_copy, monkeypatch):
    """Skip the header check: the loader's own SafetensorError is still reported with the path."""
    monkeypatch.setattr(model_loading, "check_weight_files", lambda *a: None)
    weights(model_copy).write_bytes(weights(model_copy).read_bytes()[:-100])
    with pytest.raises(ModelFileError) as err:
        LLM(str(model_copy))
    assert f"model.path: cannot read the weights in {str(model_copy)!r} (SafetensorError:" in str(err.value)
    assert FIX in str(err.value)


def test_generate_cli_prints_one_line(model_copy, capsys):
    weights(model_copy).write_bytes(weights(model_copy).read_bytes()[:-100])
    assert main(["generate", "--model", str(model_copy), "--max-tokens", "2", "hi"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"error: model.path: weight file {str(weights(model_copy))!r} is truncated")


# --- drafts ------------------------------------------------------------------------

def draft_config(draft: Path) -> dict:
    return {"proposer": "draft_model", "proposer_options": {"model": str(draft)}, "num_speculative_tokens": 2}


def swap_ids(draft: Path, a: str, b: str) -> None:
    path = draft / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(data))


def test_draft_with_another_vocabulary_of_the_same_size_is_refused(llama_dir, model_copy):
    swap_ids(model_copy, "!", '"')
    with pytest.raises(ValueError) as err:
        LLM(str(llama_dir), speculative=draft_config(model_copy))
    message = str(err.value)
    for w in [f"speculative.proposer_options.model = {str(model_copy)!r}", "the draft's tokenizer differs",
              "2 of 384 vocabulary ids differ", "id 2 is '\"' in the draft but '!' in the target",
              "id 3 is '!' in the draft but '\"' in the target", "pick a draft trained with the target's tokenizer"]:
        assert w in message, f"{w!r} missing from:\n{message}"


def test_draft_with_other_special_tokens_is_refused(llama_dir, model_copy):
    path = model_copy / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data["eos_token"] = "<|bos|>"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="eos_token is '<\\|bos\\|>' in the draft but '<\\|eos\\|>' in the target"):
        LLM(str(llama_dir), speculative=draft_config(model_copy))


def test_draft_without_tokenizer_names_an_existing_option(llama_dir, model_copy):
    for f in model_copy.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            f.unlink()
    with pytest.raises(FileNotFoundError) as err:
        LLM(str(llama_dir), speculative=draft_config(model_copy))
    message = str(err.value)
    assert message.startswith(f"speculative.proposer_options.model = {str(model_copy)!r}: cannot load a tokenizer")
    assert "copy the target's tokenizer files" in message and "tokenizer.save_pretrained" in message
    from speculant.proposers.draft_model import DraftModelOptions

    # every option the message names exists
    assert "proposer_options.model.tokenizer" not in message and "set model.tokenizer" not in message
    assert "model" in DraftModelOptions.model_fields


def test_draft_mismatch_from_the_cli_is_one_line(llama_dir, model_copy, tmp_path, capsys):
    swap_ids(model_copy, "#", "!")
    config = tmp_path / "spec.toml"
    config.write_text(f'[model]\npath = "{llama_dir}"\n[speculative]\nproposer = "draft_model"\n'
                      f'proposer_options = {{ model = "{model_copy}" }}\n')
    assert main(["generate", "--config", str(config), "--max-tokens", "2", "hi"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert err.startswith("error: speculative.proposer_options.model = ") and "tokenizer differs" in err


def test_draft_sharing_the_tokenizer_still_loads(llama_dir, spec_noisy_draft_dir):
    llm = LLM(str(llama_dir), speculative=draft_config(spec_noisy_draft_dir))
    assert llm.engine.spec.proposer is not None
