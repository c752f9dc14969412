"""The bundled demo models (models/demo-target, models/demo-draft) and the
example configs that use them: they load through the public API, greedy
output equals transformers' ``generate()``, and greedy speculative output
(draft model under both scorers, n-gram, and the shipped heads) equals
non-speculative output token for token, with chunked prefill on where the
proposer supports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from greedy_compare import HFReference, check_all_greedy
from speculant import LLM, SamplingParams
from speculant.config.compat import load_config

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
TARGET, DRAFT = MODELS / "demo-target", MODELS / "demo-draft"
HEADS = {"medusa": MODELS / "demo-medusa"}  # mlp_speculator: random heads in tests/heads (no trained one ships)
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.*") if p.suffix in (".toml", ".yaml", ".yml"))

PROMPTS = [
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "    for line in lines:\n        line = line.strip()\n        if not line:\n",
    "# Copyright",
]
MAX_TOKENS = 48
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def prompt_ids() -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TARGET))
    return [tok(p)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def plain_outputs(prompt_ids) -> list[list[int]]:
    llm = LLM(model=str(TARGET), max_num_batched_tokens=16, max_num_seqs=8)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompt_ids, GREEDY, use_tqdm=False)]


def test_bundle_is_complete_16_bit_and_small():
    total = 0
    for d in (TARGET, DRAFT, *HEADS.values()):
        assert (d / "config.json").is_file(), f"{d} has no config.json"
        assert (d / "model.safetensors").is_file(), f"{d} has no model.safetensors"
        total += sum(f.stat().st_size for f in d.iterdir() if f.is_file())
    for d in (TARGET, DRAFT):
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            assert (d / name).is_file(), f"{d} has no {name}"
        header = (d / "model.safetensors").read_bytes()
        meta = json.loads(header[8: 8 + int.from_bytes(header[:8], "little")])
        dtypes = {v["dtype"] for k, v in meta.items() if k != "__metadata__"}
        assert dtypes == {"F16"}, f"{d}: weights on disk are {dtypes}, expected float16"
    assert (TARGET / "tokenizer.json").read_bytes() == (DRAFT / "tokenizer.json").read_bytes()
    assert total < 80 * 2**20, f"bundle is {total / 2**20:.1f} MiB, over the 80 MB budget"


def test_target_greedy_equals_transformers(prompt_ids, plain_outputs):
    ref = HFReference(TARGET)
    check_all_greedy(plain_outputs, [ref.greedy(p, MAX_TOKENS) for p in prompt_ids], "demo target")


def test_target_text_is_not_a_loop(plain_outputs):
    """A trained model continues code; an untrained or broken one repeats one token."""
    for out in plain_outputs:
        assert len(set(out)) >= 8, f"degenerate demo output {out}"


@pytest.mark.parametrize("spec, min_acceptance", [
    ({"proposer": "draft_model", "scorer": "mqa", "proposer_options": {"model": str(DRAFT)}}, 0.2),
    ({"proposer": "draft_model", "scorer": "batch_expansion", "proposer_options": {"model": str(DRAFT)}}, 0.2),
    ({"proposer": "ngram", "scorer": "mqa"}, 0.05),  # copies only where the text repeats
], ids=["draft-mqa", "draft-batch-expansion", "ngram"])
def test_greedy_speculation_equals_plain(prompt_ids, plain_outputs, spec, min_acceptance):
    llm = LLM(model=str(TARGET), max_num_batched_tokens=16, max_num_seqs=8,
              speculative={**spec, "num_speculative_tokens": 4})
    outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompt_ids, GREEDY, use_tqdm=False)]
    assert outs == plain_outputs
    # the shipped pair agrees often; a broken draft or hand-off would not
    assert llm.get_metrics()["acceptance_rate"] > min_acceptance


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_greedy_heads_equal_plain(prompt_ids, plain_outputs, kind):
    llm = LLM(model=str(TARGET), max_num_batched_tokens=256, max_num_seqs=8, enable_chunked_prefill=False,
              speculative={"proposer": kind, "num_speculative_tokens": 3,
                           "proposer_options": {"path": str(HEADS[kind])}})
    outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompt_ids, GREEDY, use_tqdm=False)]
    assert outs == plain_outputs
    # weak heads (models/README.md: ~0.1-0.25), but far above chance (1/4096) or a broken hand-off
    assert llm.get_metrics()["acceptance_rate"] > 0.05


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_configs_build_and_generate(path, tmp_path, tokenizer_dir, monkeypatch):
    config = load_config(path)
    if config.model.path.endswith(".gguf"):
        # the real model's GGUF is the demo's (scripts/demo.sh sets its path); tests never need the
        # 93 MB file: the same settings run on a tiny GGUF written here
        from tiny_gguf import write_tiny_gguf

        monkeypatch.setenv("SPECULANT_CACHE_DIR", str(tmp_path / "cache"))
        tiny = write_tiny_gguf(tmp_path / "tiny.gguf", tokenizer_dir)
        config = config.model_copy(update={"model": config.model.model_copy(update={"path": str(tiny)})})
    llm = LLM(config=config)
    out = llm.generate(["def add(a, b):\n"], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8
