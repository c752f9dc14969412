"""``speculant bench`` on what the real-model job needs: a GGUF target, a
reduced-precision dtype in both engines, chat-rendered prompts, decode-only
rates, time to first token, and the memory-bandwidth bound."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from chat_models import with_chat_template
from speculant.bench import add_bound, render_prompts
from speculant.bench.bandwidth import bound_tokens_per_s, decode_weight_bytes, model_decode_bytes
from speculant.cli import main
from tiny_models import copy_model


@pytest.mark.parametrize("tied", [True, False])
def test_decode_weight_bytes_counts_every_weight_once_and_one_embedding_row(llama_dir, tied):
    config = AutoConfig.from_pretrained(llama_dir)
    config.tie_word_embeddings = tied
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    emb = model.get_input_embeddings().weight
    assert (model.get_output_embeddings().weight is emb) == tied
    everything = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) * 2
    want = everything if tied else everything - (emb.numel() - emb.shape[1]) * 2
    assert decode_weight_bytes(model) == want
    assert model_decode_bytes(str(llama_dir), torch.float32)["weight_bytes_per_decode_step"] == \
        decode_weight_bytes(AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32))
    assert bound_tokens_per_s(want, 10.0) == pytest.approx(10e9 / want)


def test_bound_fraction_only_for_batch_one_rows_with_a_decode_rate():
    rows = [{"concurrency": 1, "decode_tokens_per_s": 30.0}, {"concurrency": 32, "decode_tokens_per_s": None},
            {"concurrency": 1, "decode_tokens_per_s": None}]
    add_bound(rows, 60.0)
    assert [r["bound_fraction"] for r in rows] == [0.5, None, None]


@pytest.fixture(scope="module")
def chat_dir(llama_dir, tmp_path_factory):
    return with_chat_template(llama_dir, tmp_path_factory.mktemp("bench_chat"))


def test_chat_prompts_are_rendered_with_the_template(chat_dir, llama_dir):
    tok = AutoTokenizer.from_pretrained(chat_dir)
    ids = render_prompts(tok, ["def f(x):"], chat=True)
    assert tok.decode(ids[0]) == "<|bos|>user: def f(x):\n<|bos|>assistant:"
    with pytest.raises(ValueError, match="--chat: the target's tokenizer has no chat template"):
        render_prompts(AutoTokenizer.from_pretrained(llama_dir), ["x"], chat=True)


def test_gguf_target_in_bfloat16_with_chat_prompts(tmp_path, tokenizer_dir, one_thread, monkeypatch):
    pytest.importorskip("gguf")
    from speculant.model.loading import gguf_source
    from tiny_gguf import write_tiny_gguf

    monkeypatch.setenv("SPECULANT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_source, "_private", {})
    gguf = write_tiny_gguf(tmp_path / "tiny.Q8_0.gguf", tokenizer_dir)
    out = tmp_path / "r.json"
    code = main(["bench", "--quick", "--target", str(gguf), "--dtype", "bfloat16", "--out", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["settings"]["dtype"] == "bfloat16" and data["env"]["cpu"]
    facts = data["model"]
    assert facts["dtype"] == "bfloat16" and facts["bound_decode_tokens_per_s"] > 0
    assert all(b["best_gb_s"] > 0 for b in facts["read_bandwidth_gb_s"])
    by = {(r["engine"], r["method"]): r for r in data["rows"]}
    for key in (("speculant", "no_spec"), ("speculant", "ngram"), ("transformers", "generate")):
        r = by[key]
        assert r["status"] == "ok", r
        assert r["decode_tokens_per_s"] > 0 and r["ttft_ms"] > 0
        assert r["bound_fraction"] == pytest.approx(r["decode_tokens_per_s"] / facts["bound_decode_tokens_per_s"])
    assert by[("speculant", "ngram")]["matches_no_spec"] is True


def test_transformers_rows_keep_eos_as_an_ordinary_token(tmp_path, llama_dir, tokenizer_dir, one_thread):
    """A model that emits its EOS early (as a chat model ends its reply): both engines
    generate past it, EOS included, so transformers' rows equal Speculant's token for
    token (masking EOS with min_new_tokens would part them at the first EOS)."""
    from speculant import LLM, SamplingParams
    from speculant.bench import DEFAULT_PROMPTS
    from tiny_models import set_eos_token

    prompt = AutoTokenizer.from_pretrained(llama_dir)(DEFAULT_PROMPTS[0])["input_ids"]
    greedy = LLM(str(llama_dir)).generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                                          use_tqdm=False)[0].outputs[0].token_ids
    model = set_eos_token(copy_model(llama_dir, tmp_path / "eos_model"), greedy[2])
    out = tmp_path / "r.json"
    assert main(["bench", "--quick", "--target", str(model), "--out", str(out)]) == 0
    by = {(r["engine"], r["method"]): r for r in json.loads(out.read_text())["rows"]}
    assert by[("speculant", "no_spec")]["num_tokens"] == 2 * 8
    for method in ("generate", "prompt_lookup"):
        assert by[("transformers", method)]["matches_no_spec"] is True, by[("transformers", method)]
