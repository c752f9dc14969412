"""``model.load_format = "dummy"``: a model built from config.json alone with
seeded random weights (benchmarks at sizes no checkpoint here has)."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from speculant import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture(scope="module")
def config_only_dir(tmp_path_factory, llama_dir):
    out = tmp_path_factory.mktemp("config_only")
    for f in llama_dir.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, out / f.name)
    return out


def _tokens(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_dummy_weights_are_transformers_own_seeded_init(config_only_dir):
    llm = LLM(model=str(config_only_dir), load_format="dummy", seed=3, device="cpu")
    torch.manual_seed(3)
    ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_only_dir), dtype=torch.float32).eval()
    want = []
    for p in PROMPTS:
        out = ref.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
        want.append(out[0, len(p):].tolist())
    assert _tokens(llm) == want


def test_dummy_load_is_seeded(config_only_dir):
    a = _tokens(LLM(model=str(config_only_dir), load_format="dummy", seed=1, device="cpu"))
    b = _tokens(LLM(model=str(config_only_dir), load_format="dummy", seed=1, device="cpu"))
    c = _tokens(LLM(model=str(config_only_dir), load_format="dummy", seed=2, device="cpu"))
    assert a == b and a != c


def test_without_dummy_a_directory_without_weights_is_refused(config_only_dir):
    with pytest.raises(Exception, match="safetensors"):
        LLM(model=str(config_only_dir), device="cpu")


def test_an_unknown_load_format_names_the_choices(config_only_dir):
    with pytest.raises(Exception, match="load_format"):
        LLM(model=str(config_only_dir), load_format="random")
