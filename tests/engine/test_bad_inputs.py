"""Bad inputs: each gives a clear error (naming the option and the fix) and
leaves the engine serving everyone else — after the error, the same valid
request still returns exactly the tokens it returned before.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from serving_check import GOOD_PARAMS, GOOD_PROMPT, assert_still_serving, assert_words, good_tokens, small_llm

from greedy_compare import check_greedy
from speculant import LLM, LLMEngine, SamplingParams
from speculant.config.compat import load_config
from speculant.config.models import ConfigError
from tiny_models import build_gemma2, copy_model, patch_config, random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def llm(llama_dir):
    return small_llm(llama_dir)


@pytest.fixture(scope="module")
def baseline(llm):
    return good_tokens(llm)


# --- bad requests ---------------------------------------------------------------

BAD_PROMPTS = {
    # name: (prompt, exception, words the message must contain: what, and the fix)
    "empty-string": ("", ValueError, ["prompt is empty", "pass at least one token"]),
    "empty-token-list": ([], ValueError, ["prompt is empty", "pass at least one token"]),
    "at-max-model-len": (list(range(2, 258)), ValueError,
                         ["256 tokens", "max_model_len", "shorten the prompt or raise model.max_model_len"]),
    "over-max-model-len": (list(range(2, 302)), ValueError,
                           ["300 tokens", "max_model_len", "shorten the prompt or raise model.max_model_len"]),
    "id-past-vocab": ([5, 6, 384], ValueError, ["[384]", "outside the vocabulary [0, 384)", "tokenizer"]),
    "negative-id": ([-1, 5], ValueError, ["[-1]", "outside the vocabulary", "tokenizer"]),
    "not-a-prompt": (3.5, TypeError, ["prompt must be a str or a list of int token ids", "float"]),
}


@pytest.mark.parametrize("name", list(BAD_PROMPTS))
def test_bad_prompt_in_generate(name, llm, baseline):
    prompt, exc, words = BAD_PROMPTS[name]
    with pytest.raises(exc) as err:
        llm.generate([prompt], GOOD_PARAMS, use_tqdm=False)
    assert_words(str(err.value), *words)
    assert_still_serving(llm, baseline)


@pytest.mark.parametrize("name", list(BAD_PROMPTS))
def test_bad_prompt_while_others_run(name, llm, baseline):
    """The refusal happens mid-stream; the request already running is untouched."""
    prompt, exc, words = BAD_PROMPTS[name]
    engine = llm.engine
    rid = engine.add_request(None, GOOD_PROMPT, GOOD_PARAMS)
    engine.step()
    engine.step()
    with pytest.raises(exc) as err:
        engine.add_request(None, prompt, GOOD_PARAMS)
    assert_words(str(err.value), *words)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid and out.finished:
                final = out
    assert final is not None and final.outputs[0].token_ids == baseline
    assert_still_serving(llm, baseline)


def test_bad_prompt_in_a_batch_queues_none_of_it(llm, baseline):
    with pytest.raises(ValueError) as err:
        llm.generate([GOOD_PROMPT, GOOD_PROMPT, ""], GOOD_PARAMS, use_tqdm=False)
    assert_words(str(err.value), "prompt 2", "prompt is empty")
    assert_still_serving(llm, baseline)


BAD_PARAMS = {
    # name: (SamplingParams kwargs, words)
    "max_tokens=0": (dict(max_tokens=0), ["max_tokens=0", ">= 1", "ask for at least one token"]),
    "max_tokens=-3": (dict(max_tokens=-3), ["max_tokens=-3", ">= 1"]),
    "temperature<0": (dict(temperature=-0.5), ["temperature=-0.5", ">= 0", "use 0 for greedy"]),
    "top_p=0": (dict(top_p=0.0), ["top_p=0.0", "(0, 1]", "use 1.0 to disable"]),
    "top_p>1": (dict(top_p=1.5), ["top_p=1.5", "(0, 1]", "use 1.0 to disable"]),
    "top_p<0": (dict(top_p=-0.1), ["top_p=-0.1", "(0, 1]"]),
    "top_k<-1": (dict(top_k=-2), ["top_k=-2", "use 0 or -1 to disable"]),
    "min_p>1": (dict(min_p=1.5), ["min_p=1.5", "[0, 1]"]),
    "logprobs<0": (dict(logprobs=-1), ["logprobs=-1"]),
    "empty-stop": (dict(stop=[""]), ["stop", "remove empty stop strings"]),
}


@pytest.mark.parametrize("name", list(BAD_PARAMS))
def test_bad_sampling_params(name, llm, baseline):
    kwargs, words = BAD_PARAMS[name]
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert_words(str(err.value), "SamplingParams.", *words)
    assert_still_serving(llm, baseline)


def test_abort_running_request_leaves_others_correct(llm, baseline, hf_reference):
    engine = llm.engine
    prompts = random_prompts([6, 13, 21], seed=42)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ids = [engine.add_request(f"abort-{i}", p, params) for i, p in enumerate(prompts)]
    for _ in range(4):
        engine.step()
    assert engine.abort_request(ids[1]) is True
    assert engine.abort_request(ids[1]) is False, "aborting twice"
    assert engine.abort_request("no-such-request") is False
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id != ids[1], "an aborted request still produced output"
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
    assert set(finals) == {ids[0], ids[2]}
    ref = hf_reference("llama")
    for i in (0, 2):
        check_greedy(finals[ids[i]], ref.greedy(prompts[i], 12), f"request {i}")
    blocks = engine.blocks
    assert blocks.num_free_blocks == blocks.num_blocks, "the aborted request's KV blocks were not freed"
    assert_still_serving(llm, baseline)


def test_abort_waiting_request(llm, baseline):
    engine = llm.engine
    ids = [engine.add_request(None, GOOD_PROMPT, GOOD_PARAMS) for _ in range(6)]  # max_num_seqs is 4
    engine.step()
    assert engine.abort_request(ids[5]) is True
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
    assert set(finals) == set(ids[:5])
    assert_still_serving(llm, baseline)


# --- bad configuration ---------------------------------------------------------

def _toml(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def test_unknown_config_key_names_file_key_path_and_allowed_keys(tmp_path, llama_dir, llm, baseline):
    cfg = _toml(tmp_path / "engine.toml",
                f'[model]\npath = "{llama_dir}"\n[scheduler]\nmax_num_batch_tokens = 64\n')
    for load in (load_config, LLM.from_config):
        with pytest.raises(ConfigError) as err:
            load(str(cfg))
        msg = str(err.value)
        assert_words(msg, str(cfg), "scheduler.max_num_batch_tokens", "unknown key", "allowed keys",
                     "max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill")
    assert_still_serving(llm, baseline)


def test_unknown_config_section(tmp_path, llama_dir):
    cfg = _toml(tmp_path / "engine.toml", f'[model]\npath = "{llama_dir}"\n[schedular]\nmax_num_seqs = 4\n')
    with pytest.raises(ConfigError) as err:
        load_config(str(cfg))
    assert_words(str(err.value), str(cfg), "schedular", "unknown key", "cache", "scheduler", "speculative")


def test_unknown_key_in_yaml_and_in_overrides(tmp_path, llama_dir):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(f"model:\n  path: {llama_dir}\ncache:\n  blocksize: 8\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(cfg))
    assert_words(str(err.value), str(cfg), "cache.blocksize", "block_size", "num_blocks")
    ok = _toml(tmp_path / "ok.toml", f'[model]\npath = "{llama_dir}"\n')
    with pytest.raises(ConfigError) as err:
        load_config(str(ok), ["scheduler.max_seqs=4"])
    assert_words(str(err.value), "scheduler.max_seqs", "max_num_seqs")


def test_bad_config_value(tmp_path, llama_dir):
    cfg = _toml(tmp_path / "engine.toml", f'[model]\npath = "{llama_dir}"\n[scheduler]\nmax_num_seqs = 0\n')
    with pytest.raises(ConfigError) as err:
        load_config(str(cfg))
    assert_words(str(err.value), str(cfg), "scheduler.max_num_seqs = 0", "greater than or equal to 1")


def test_budget_below_max_num_seqs(llama_dir):
    with pytest.raises(ConfigError) as err:
        LLM(str(llama_dir), max_num_batched_tokens=4, max_num_seqs=8)
    assert_words(str(err.value), "max_num_batched_tokens", "max_num_seqs", "Raise max_num_batched_tokens")


def test_unknown_llm_keyword(llama_dir):
    with pytest.raises(TypeError) as err:
        LLM(str(llama_dir), max_num_batch_tokens=8)
    assert_words(str(err.value), "max_num_batch_tokens", "allowed", "max_num_batched_tokens")


def test_missing_model_directory(tmp_path, llm, baseline):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError) as err:
        LLM(str(missing))
    assert_words(str(err.value), "model.path", str(missing), "no such directory", "Hugging Face model directory")
    cfg = _toml(tmp_path / "engine.toml", f'[model]\npath = "{missing}"\n')
    with pytest.raises(FileNotFoundError) as err:
        LLM.from_config(str(cfg))
    assert_words(str(err.value), "model.path", str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as err:
        LLM(str(empty))
    assert_words(str(err.value), "model.path", "no config.json", "save_pretrained")
    assert_still_serving(llm, baseline)


def test_max_model_len_beyond_the_model(llama_dir):
    with pytest.raises(ValueError) as err:
        LLM(str(llama_dir), max_model_len=300)
    assert_words(str(err.value), "model.max_model_len = 300", "256", "set it to at most 256")


def test_kv_pool_smaller_than_one_sequence(llama_dir):
    with pytest.raises(ValueError) as err:
        LLM(str(llama_dir), block_size=4, num_blocks=10, max_model_len=256)  # explicit: a default is lowered
    assert_words(str(err.value), "cache.num_blocks = 10", "max_model_len = 256", "at least 64")


# --- unsupported attention features ------------------------------------------------

@pytest.fixture(scope="module")
def windowed_mistral(model_dirs, tmp_path_factory):
    return patch_config(copy_model(model_dirs["mistral"], tmp_path_factory.mktemp("mistral_sw")), sliding_window=32)


def test_sliding_window_below_max_model_len_is_refused(windowed_mistral, llm, baseline):
    with pytest.raises(ValueError) as err:
        LLM(str(windowed_mistral))
    assert_words(str(err.value), "mistral", "sliding-window", "sliding_window=32", "max_model_len=256",
                 "set model.max_model_len <= 32")
    assert_still_serving(llm, baseline)


def test_sliding_window_not_below_max_model_len_runs_exactly(windowed_mistral, hf_reference):
    """A window at least max_model_len changes nothing, so the model loads and
    matches HF (whose mask does apply the window)."""
    assert_greedy_matches_hf(windowed_mistral, hf_reference, [10, 15], seed=43, max_tokens=16, max_model_len=32)


def assert_greedy_matches_hf(model_dir, hf_reference, lengths: list[int], seed: int, max_tokens: int,
                             **engine_args) -> None:
    """Greedy output of a small engine on ``model_dir`` equals transformers' on random prompts."""
    llm = LLM(str(model_dir), block_size=4, max_num_batched_tokens=8, max_num_seqs=2, **engine_args)
    prompts = random_prompts(lengths, seed=seed)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                        use_tqdm=False)
    ref = hf_reference(model_dir)
    assert len(outs) == len(prompts)
    for p, o in zip(prompts, outs):
        check_greedy(o.outputs[0].token_ids, ref.greedy(p, max_tokens))


@pytest.fixture(scope="module")
def softcapped_gemma2(tokenizer_dir, tmp_path_factory):
    return build_gemma2(tmp_path_factory.mktemp("gemma2_softcap"), tokenizer_dir, softcap=50.0)


def test_attention_logit_softcapping_is_refused(softcapped_gemma2, llm, baseline):
    with pytest.raises(ValueError) as err:
        LLM(str(softcapped_gemma2))
    assert_words(str(err.value), "model.path", "gemma2", "soft-capping", "attn_logit_softcapping=50.0",
                 "Refusing to load")
    assert_still_serving(llm, baseline)


def test_attention_logit_softcapping_error_says_what_to_do(softcapped_gemma2):
    with pytest.raises(ValueError) as err:
        LLM(str(softcapped_gemma2))
    assert re.search(r"\b(use|set|pick|choose|remove|disable)\b", str(err.value)), str(err.value)


def test_same_architecture_without_softcapping_runs_exactly(tokenizer_dir, tmp_path, hf_reference):
    """The refusal is about the feature, not the architecture."""
    model_dir = build_gemma2(tmp_path / "gemma2", tokenizer_dir, softcap=None)
    assert_greedy_matches_hf(model_dir, hf_reference, [7, 12], seed=44, max_tokens=12)


def test_engine_api_rejects_duplicate_request_id(llm, baseline):
    engine: LLMEngine = llm.engine
    engine.add_request("dup", GOOD_PROMPT, GOOD_PARAMS)
    with pytest.raises(ValueError) as err:
        engine.add_request("dup", GOOD_PROMPT, GOOD_PARAMS)
    assert_words(str(err.value), "'dup'", "already in use", "unique")
    while engine.has_unfinished_requests():
        engine.step()
    assert_still_serving(llm, baseline)
