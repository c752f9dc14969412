"""``model.fast_forward``: speculant's own decoder loop for the llama family
(speculant/model/fast_forward/). Declines name their reason, "on" errors say
how to fix them, a wrong decoder is caught by the load-time probe (auto falls
back, on refuses), rotary variants / biases / tied embeddings / plain linears
match transformers token for token in float32, bf16 output equals the
reference path's, and the draft model takes the same path."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from arch_zoo import build_arch_model, matrix_prompts, tiny_config
from fast_paths import expect_fast_forward
from greedy_compare import check_all_greedy
from speculant import LLM, SamplingParams
from speculant.cli import main
from speculant.model.fast_forward import decoder as decoder_module
from speculant.model.fast_forward.plan import Plan, plan_model
from speculant.model.fast_forward.setup import FastForwardError

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
PROMPTS = matrix_prompts()[:5]


def in_memory(arch: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), dtype=torch.float32)


DECLINED = {
    # case: (arch, config overrides, max_model_len, the reason's words)
    "qwen3-qk-norms": ("qwen3", {}, 256, "architecture 'qwen3' has no fast decoder (implemented: llama, mistral, "
                                         "qwen2)"),
    "gemma": ("gemma", {}, 256, "architecture 'gemma' has no fast decoder"),
    "gelu": ("llama", dict(hidden_act="gelu"), 256, "activation 'gelu' (the fast MLP computes silu(gate) * up)"),
    "dynamic-rope": ("llama", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
                     256, "rope type 'dynamic' (the fast path takes cos/sin from a table of positions"),
    "mistral-window": ("mistral", dict(sliding_window=32), 256,
                       "sliding-window attention (sliding_window=32 < max_model_len=256)"),
    "qwen2-window": ("qwen2", dict(use_sliding_window=True, sliding_window=32, max_window_layers=0), 256,
                     "sliding-window attention (sliding_window=32 < max_model_len=256)"),
}


@pytest.mark.parametrize("case", list(DECLINED))
def test_unsupported_models_are_declined_with_their_reason(case):
    arch, overrides, max_len, words = DECLINED[case]
    reasons = plan_model(in_memory(arch, **overrides), max_len)
    assert isinstance(reasons, list), f"{case}: planned {reasons}"
    assert any(words in r for r in reasons), reasons


def test_a_module_the_family_lacks_is_declined_by_name():
    model = in_memory("llama")
    model.model.layers[1].self_attn.q_norm = torch.nn.LayerNorm(16)  # what a config flag would not show
    assert plan_model(model, 256) == ["layer 1: attention modules ['q_norm'] (e.g. q/k norms) differ from the "
                                      "family's"]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_supported_families_plan(arch):
    plan = plan_model(in_memory(arch, **({"sliding_window": None} if arch == "mistral" else {})), 256)
    assert isinstance(plan, Plan) and plan.spec.model_type == arch
    assert (plan.num_layers, plan.head_dim, plan.scaling) == (2, 16, 0.25)


def test_on_refuses_an_unsupported_model_naming_option_value_reason_and_fix(zoo):
    path = zoo("qwen3")
    with pytest.raises(FastForwardError) as err:
        LLM(str(path), fast_forward="on")
    assert str(err.value) == (
        f"model.fast_forward = 'on' cannot run model.path = '{path}' (qwen3): architecture 'qwen3' has no fast "
        "decoder (implemented: llama, mistral, qwen2). Set model.fast_forward = 'auto' to run such a model on "
        "transformers' modules, or 'off'.")


def test_auto_runs_an_unsupported_model_on_transformers_modules_and_logs_why(zoo, caplog):
    with caplog.at_level(logging.INFO, logger="speculant.model.fast_forward.setup"):
        llm = LLM(str(zoo("qwen3")))
    status = llm.engine.runner.fast_forward
    assert not status.active and status.reason.startswith("architecture 'qwen3' has no fast decoder")
    assert any("runs transformers' modules: architecture 'qwen3'" in r.getMessage() for r in caplog.records)


def stretched_lookup(self, positions):
    """A deliberately wrong rotary: every distance doubled (a uniform shift would not do:
    attention sees only relative positions)."""
    return original_lookup(self, positions * 2)


original_lookup = decoder_module.RotaryTable.lookup


def test_a_wrong_decoder_fails_the_probe_auto_falls_back_and_on_refuses(zoo, hf_reference, monkeypatch):
    monkeypatch.setattr(decoder_module.RotaryTable, "lookup", stretched_lookup)
    llm = LLM(str(zoo("llama")))
    status = llm.engine.runner.fast_forward
    assert not status.active and status.deviation is not None and status.deviation > 1e-2
    assert "differ from transformers' modules by" in status.reason and "load-time probe" in status.reason
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)  # the reference path: still exact
    check_all_greedy([o.outputs[0].token_ids for o in outs],
                     [hf_reference(zoo("llama")).greedy(p, MAX_TOKENS) for p in PROMPTS], "fallback")
    with pytest.raises(FastForwardError, match="in the load-time probe"):
        LLM(str(zoo("llama")), fast_forward="on")


VARIANTS = {
    # name: (arch, config overrides): rotary variants, biases, tied embeddings
    "rope-linear": ("llama", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})),
    "rope-llama3": ("llama", dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64})),
    "rope-yarn": ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                 "original_max_position_embeddings": 64})),
    "biases-tied": ("llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    "qwen2-tied": ("qwen2", dict(use_sliding_window=False, tie_word_embeddings=True)),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_take_the_fast_path_and_match_transformers(name, tmp_path, tokenizer_dir, hf_reference):
    arch, overrides = VARIANTS[name]
    path = build_arch_model(arch, tmp_path / name, tokenizer_dir, overrides=overrides)
    llm = LLM(str(path), fast_forward="on", block_size=4, max_num_batched_tokens=24, max_num_seqs=8)
    assert expect_fast_forward(llm) == ["target"]
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    check_all_greedy([o.outputs[0].token_ids for o in outs],
                     [hf_reference(path).greedy(p, MAX_TOKENS) for p in PROMPTS], name)


def test_plain_linears_are_merged_into_views_and_match_transformers(zoo, hf_reference):
    """linear_backend = 'default': q/k/v and gate/up are concatenated once; the modules'
    weights become views of the concatenation (no second copy)."""
    llm = LLM(str(zoo("mistral")), linear_backend="default", fast_forward="on")
    attn = llm.engine.runner.model.model.layers[0].self_attn
    q, k = attn.q_proj.weight, attn.k_proj.weight
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    check_all_greedy([o.outputs[0].token_ids for o in outs],
                     [hf_reference(zoo("mistral")).greedy(p, MAX_TOKENS) for p in PROMPTS], "plain linears")


def test_the_draft_model_takes_the_fast_path(zoo, hf_reference):
    spec = dict(proposer="draft_model", scorer="mqa", num_speculative_tokens=3,
                proposer_options={"model": str(zoo("llama", draft=True))})
    llm = LLM(str(zoo("llama")), speculative=spec, block_size=4, max_num_batched_tokens=32, max_num_seqs=8)
    assert expect_fast_forward(llm) == ["target", "draft"]
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.get_metrics()["num_accepted_tokens"] > 0
    check_all_greedy([o.outputs[0].token_ids for o in outs],
                     [hf_reference(zoo("llama")).greedy(p, MAX_TOKENS) for p in PROMPTS], "draft")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_bfloat16_output_equals_the_reference_path(arch, zoo):
    """Both paths run the same GEMMs and norms, so bf16 text is identical, not only near."""
    outs = {}
    for setting in ("off", "on"):
        llm = LLM(str(zoo(arch)), dtype="bfloat16", fast_forward=setting, block_size=4, max_num_batched_tokens=24,
                  max_num_seqs=8)
        assert expect_fast_forward(llm) == (["target"] if setting == "on" else [])
        if setting == "on":  # the C norms, linears and rotary round as the modules do: no deviation at all
            assert llm.engine.runner.fast_forward.deviation == 0.0
        outs[setting] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert outs["on"] == outs["off"]


def test_generate_verbose_says_which_path_ran(zoo, capsys):
    assert main(["generate", "--model", str(zoo("llama")), "--verbose", "--max-tokens", "2", "hello"]) == 0
    out = capsys.readouterr().out
    assert "model.fast_forward: fast decoder (llama; built in " in out and "probe " in out
    assert "memory: packed weights on normal pages: no packed bfloat16 weights" in out  # a float32 model
    assert "model.linear_backend: onednn (15 layer(s) packed, 0 on F.linear; requested 'auto')" in out or \
        not torch.backends.mkldnn.is_available()
    assert main(["generate", "--model", str(zoo("qwen3")), "--verbose", "--max-tokens", "2", "hello"]) == 0
    assert "model.fast_forward: transformers' modules (architecture 'qwen3' has no fast decoder" in \
        capsys.readouterr().out


def test_auto_is_the_default():
    from speculant.config.compat import build_config

    assert build_config({"model": {"path": "m"}}).model.fast_forward == "auto"


def test_cos_sin_computed_per_forward_beyond_the_table_limit(zoo, hf_reference, monkeypatch):
    """Models with more positions than MAX_TABLE_POSITIONS compute cos/sin per forward: same output."""
    monkeypatch.setattr(decoder_module, "MAX_TABLE_POSITIONS", 8)
    llm = LLM(str(zoo("llama")), fast_forward="on", block_size=4, max_num_batched_tokens=24, max_num_seqs=8)
    decoder = llm.engine.runner.fast_forward.decoder
    assert decoder is not None and decoder.rotary.cos is None
    assert llm.engine.runner.fast_forward.deviation == 0.0
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    check_all_greedy([o.outputs[0].token_ids for o in outs],
                     [hf_reference(zoo("llama")).greedy(p, MAX_TOKENS) for p in PROMPTS], "no table")
