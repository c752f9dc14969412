"""A draft model that cannot serve the target is refused at config time, with
an error naming ``speculative.proposer_options.model`` and the reason."""

from __future__ import annotations

import pytest

from speculant import LLM
from speculant.config.compat import load_config
from speculant.config.models import ConfigError
from tiny_models import build_model

KEY = "speculative.proposer_options.model"


@pytest.fixture(scope="module")
def other_vocab_draft(tmp_path_factory, tokenizer_dir):
    return build_model("llama", tmp_path_factory.mktemp("draft_vocab300"), tokenizer_dir, hidden=32, layers=1,
                       vocab_size=300)


def write_config(path, target, draft) -> str:
    path.write_text(f'[model]\npath = "{target}"\n\n[speculative]\nproposer = "draft_model"\n'
                    f'proposer_options = {{ model = "{draft}" }}\n')
    return str(path)


def test_vocab_mismatch_rejected_by_config_file(tmp_path, llama_dir, other_vocab_draft):
    """load_config alone (no model is loaded) refuses the pair."""
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path / "spec.toml", llama_dir, other_vocab_draft))
    msg = str(err.value)
    assert KEY in msg and "vocab" in msg and "300" in msg and "384" in msg, msg
    assert "spec.toml" in msg


def test_vocab_mismatch_rejected_by_llm(llama_dir, other_vocab_draft):
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), speculative={"proposer": "draft_model",
                                               "proposer_options": {"model": str(other_vocab_draft)}})
    assert KEY in str(err.value) and "vocab" in str(err.value)


@pytest.mark.parametrize("what", ["missing", "not_a_model"])
def test_draft_directory_unusable(what, tmp_path, llama_dir):
    draft = tmp_path / "no_such_draft"
    if what == "not_a_model":
        draft.mkdir()  # exists, but holds no config.json
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), speculative={"proposer": "draft_model", "proposer_options": {"model": str(draft)}})
    msg = str(err.value)
    assert KEY in msg and str(draft) in msg and "config.json" in msg, msg
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path / "spec.toml", llama_dir, draft))
    assert KEY in str(err.value)


def test_draft_options_typo_rejected(llama_dir):
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), speculative={"proposer": "draft_model",
                                               "proposer_options": {"model": str(llama_dir), "modle": "x"}})
    assert "speculative.proposer_options.modle" in str(err.value)


def test_draft_with_fewer_positions_names_the_draft(tmp_path_factory, tokenizer_dir, llama_dir):
    short = build_model("llama", tmp_path_factory.mktemp("draft_pos64"), tokenizer_dir, hidden=32, layers=1,
                        max_positions=64)
    with pytest.raises(ValueError) as err:  # ConfigError is a ValueError
        LLM(model=str(llama_dir), speculative={"proposer": "draft_model", "proposer_options": {"model": str(short)}})
    msg = str(err.value)
    assert KEY in msg and "64" in msg, msg
