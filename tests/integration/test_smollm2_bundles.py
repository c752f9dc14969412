"""The proposer shipped for SmolLM2-135M-Instruct (models/smollm2-eagle)
without the 93 MB model: a complete float16 bundle with its training
record, and on a random target of SmolLM2's shape (same tokenizer,
vocabulary, widths and rotary settings, one layer) greedy speculative
output with it equals no speculation, with chunked prefill on. Its
acceptance on the real model is measured by the training scripts
(training.json) and benchmarks/, not here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from speculant import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = Path(__file__).resolve().parents[2] / "models"
EAGLE = MODELS / "smollm2-eagle"
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _dtypes(path: Path) -> set[str]:
    header = path.read_bytes()
    meta = json.loads(header[8: 8 + int.from_bytes(header[:8], "little")])
    return {v["dtype"] for k, v in meta.items() if k != "__metadata__"}


@pytest.mark.parametrize("bundle", [EAGLE], ids=["eagle"])
def test_bundle_is_float16_small_and_records_its_training(bundle):
    assert _dtypes(bundle / "model.safetensors") - {"I32"} == {"F16"}  # I32: eagle's draft vocabulary ids
    size = sum(f.stat().st_size for f in bundle.iterdir() if f.is_file())
    assert size < 24 * 2**20, f"{bundle.name} is {size / 2**20:.1f} MiB"
    report = json.loads((bundle / "training.json").read_text())
    assert report["engine_eval"]["mean_accepted_length"] > 1.0, report["engine_eval"]
    assert json.loads((bundle / "config.json").read_text())["vocab_size"] == 49152


def test_the_test_data_holds_smollm2s_tokenizer(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")


@pytest.fixture(scope="module")
def smollm2_shaped(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """A random one-layer Llama of SmolLM2-135M's widths, with its tokenizer."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                      rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                      initializer_range=0.2)
    out = tmp_path_factory.mktemp("smollm2_shaped")
    LlamaForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_tokenizer_dir).save_pretrained(out)
    return out


SPECS = {
    "eagle": {"proposer": "eagle", "proposer_options": {"path": str(EAGLE)}},
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_greedy_with_the_shipped_proposer_equals_plain(smollm2_shaped, name):
    tok = AutoTokenizer.from_pretrained(smollm2_shaped)
    prompts = [tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
               for text in ("Why is the sky blue?", "Write a haiku about rain.", "Hi")]
    kw = {"model": str(smollm2_shaped), "max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 8}
    plain = LLM(**kw)
    spec = LLM(**kw, speculative={**SPECS[name], "num_speculative_tokens": 4})
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, GREEDY, use_tqdm=False)]
    assert got == want
    assert spec.get_metrics()["num_draft_tokens"] > 0
