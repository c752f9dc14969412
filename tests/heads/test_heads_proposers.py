"""Hidden-state proposers (Medusa, MLP speculator): exact greedy output with
chunked prefill off and on (they read hidden states only at rows that produce
a token), dimension checks, and heads that really learn.

The "Markov" target has its attention and MLP outputs zeroed, so its next
token depends only on the current one: self-distilled heads can predict it
almost perfectly, which makes the engine's acceptance rate a sharp check that
the hidden state handed to the heads is the one behind the newest token.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from speculant import LLM, SamplingParams
from speculant.config.models import ConfigError
from speculant.proposers.heads.common import save_heads
from speculant.proposers.heads.medusa import MedusaHeads, medusa_config
from speculant.proposers.heads.mlp_speculator import MLPSpeculator, mlp_speculator_config
from tiny_models import build_model

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["def foo(x):\n    return", "import os\nclass A:", "for i in range(10):\n    print(i)\n"]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
NO_CHUNK = dict(max_num_batched_tokens=64, max_num_seqs=8, enable_chunked_prefill=False)
CHUNKED = dict(max_num_batched_tokens=8, max_num_seqs=3, enable_chunked_prefill=True)  # prompts split in chunks


def _load_script():
    spec = importlib.util.spec_from_file_location("train_heads", ROOT / "scripts" / "train_heads.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_heads"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def markov_target(tmp_path_factory, tokenizer_dir) -> Path:
    out = build_model("llama", tmp_path_factory.mktemp("markov"), tokenizer_dir, seed=3)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(out)
    return out


def _spec(proposer: str, path: Path, scorer: str = "mqa", k: int = 3) -> dict:
    return {"proposer": proposer, "proposer_options": {"path": str(path)}, "scorer": scorer,
            "num_speculative_tokens": k}


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("proposer", ["medusa", "mlp_speculator"])
@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_output_equals_target_alone(llama_dir, random_heads_dirs, proposer, scorer, k):
    reference = _tokens(LLM(model=str(llama_dir), **NO_CHUNK))
    llm = LLM(model=str(llama_dir), **NO_CHUNK, speculative=_spec(proposer, random_heads_dirs[proposer], scorer, k))
    assert _tokens(llm) == reference
    assert llm.get_metrics()["num_draft_tokens"] > 0


@pytest.mark.parametrize("proposer", ["medusa", "mlp_speculator"])
@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
def test_greedy_output_under_chunked_prefill(llama_dir, random_heads_dirs, proposer, scorer):
    reference = _tokens(LLM(model=str(llama_dir), **NO_CHUNK))
    llm = LLM(model=str(llama_dir), **CHUNKED, speculative=_spec(proposer, random_heads_dirs[proposer], scorer))
    assert _tokens(llm) == reference
    assert llm.get_metrics()["num_draft_tokens"] > 0


@pytest.mark.parametrize("proposer", ["medusa", "mlp_speculator"])
def test_mismatched_head_dimensions_are_refused(tmp_path, llama_dir, proposer):
    if proposer == "medusa":
        cfg = medusa_config(48, 384, 2)
        save_heads(MedusaHeads.from_config(cfg), cfg, tmp_path)
    else:
        cfg = mlp_speculator_config(64, 500, 2)
        save_heads(MLPSpeculator.from_config(cfg), cfg, tmp_path)
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), **NO_CHUNK, speculative=_spec(proposer, tmp_path, k=2))
    key = "hidden_size 48" if proposer == "medusa" else "vocab_size 500"
    assert key in str(err.value) and "speculative.proposer_options.path" in str(err.value)


def test_more_tokens_than_heads_and_wrong_kind_are_refused(llama_dir, random_heads_dirs):
    with pytest.raises(ConfigError, match="predict at most 4 tokens; set num_speculative_tokens <= 4"):
        LLM(model=str(llama_dir), **NO_CHUNK, speculative=_spec("medusa", random_heads_dirs["medusa"], k=5))
    with pytest.raises(ConfigError, match="expected 'speculant_mlp_speculator'"):
        LLM(model=str(llama_dir), **NO_CHUNK, speculative=_spec("mlp_speculator", random_heads_dirs["medusa"]))


def test_an_unset_k_is_lowered_to_the_number_of_heads(llama_dir, random_heads_dirs):
    """The adaptive default's ceiling (8) is above these 4 heads: it is lowered, not refused."""
    spec = {k: v for k, v in _spec("medusa", random_heads_dirs["medusa"]).items() if k != "num_speculative_tokens"}
    llm = LLM(model=str(llama_dir), **NO_CHUNK, speculative=spec)
    assert llm.engine.config.speculative.num_speculative_tokens == 4
    assert all(_tokens(llm)) and llm.get_metrics()["num_draft_tokens"] > 0


@pytest.mark.parametrize("kind", ["medusa", "mlp_speculator"])
def test_self_distilled_heads_are_accepted_by_the_engine(tmp_path, markov_target, kind):
    script = _load_script()
    out = tmp_path / kind
    args = script.parse_args(["--target", str(markov_target), "--kind", kind, "--out", str(out), "--k", "2",
                              "--num-sequences", "48", "--gen-len", "24", "--prompt-len", "8",
                              "--steps", "250", "--batch-size", "128", "--lr", "1e-2",
                              "--save-dtype", "float16", "--eval-prompts", "4", "--eval-prompt-len", "8"])
    report = script.train(args)
    assert report["heldout_top1_per_head"][0] > 0.9, report
    assert report["engine_eval"]["acceptance_rate"] > 0.8, report
    assert 1.0 < report["engine_eval"]["mean_accepted_length"] <= 3.0, report
    reference = _tokens(LLM(model=str(markov_target), **NO_CHUNK))
    for chunking in (NO_CHUNK, CHUNKED):
        llm = LLM(model=str(markov_target), **chunking, speculative=_spec(kind, out, k=2))
        assert _tokens(llm) == reference
        # a hidden state off by one position would predict the wrong tokens here
        assert llm.get_metrics()["acceptance_rate"] > 0.8, llm.get_metrics()
