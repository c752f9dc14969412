"""Validation where inputs enter: SamplingParams types and ranges, prompts of
the wrong type, tiny temperatures. Each bad input is refused with a
TypeError/ValueError naming the option, the value, the reason and the fix,
and the engine keeps serving."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from serving_check import GOOD_PARAMS, GOOD_PROMPT, assert_still_serving, assert_words, good_tokens, small_llm

from speculant import LLM, SamplingParams
from speculant.config.sampling_params import MAX_LOGPROBS, MAX_SEED, MAX_TOP_K, MIN_TEMPERATURE
from speculant.sampling.logits_processing import filtered_logprobs, sampling_tensors
from speculant.sampling.sampler import sample_from_probs

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT, GREEDY = GOOD_PROMPT, GOOD_PARAMS
VOCAB = 384


@pytest.fixture(scope="module")
def llm(llama_dir):
    return small_llm(llama_dir)


@pytest.fixture(scope="module")
def baseline(llm):
    return good_tokens(llm)


# --- SamplingParams --------------------------------------------------------------

BAD_TYPES = {
    # name: (kwargs, words)
    "max_tokens=True": (dict(max_tokens=True), ["max_tokens=True", "integer", "bool", "max_tokens=16"]),
    "max_tokens=2.0": (dict(max_tokens=2.0), ["max_tokens=2.0", "an integer", "float"]),
    "top_k=True": (dict(top_k=True), ["top_k=True", "a bool is not accepted", "disable top-k"]),
    "seed=False": (dict(seed=False), ["seed=False", "integer", "bool", "or None"]),
    "seed='7'": (dict(seed="7"), ["seed='7'", "an integer", "str"]),
    "logprobs=True": (dict(logprobs=True), ["logprobs=True", "integer", "bool", f"[0, {MAX_LOGPROBS}]"]),
    "stop_token_ids=[True]": (dict(stop_token_ids=[True]), ["stop_token_ids=True", "bool", "int token ids"]),
    "stop_token_ids=[2.0]": (dict(stop_token_ids=[2.0]), ["stop_token_ids=2.0", "an integer", "float"]),
    "stop_token_ids=5": (dict(stop_token_ids=5), ["stop_token_ids=5", "a list of int token ids"]),
    "temperature=True": (dict(temperature=True), ["temperature=True", "a real number", "bool"]),
    "temperature='0.5'": (dict(temperature="0.5"), ["temperature='0.5'", "a real number", "str"]),
    "top_p=None": (dict(top_p=None), ["top_p=None", "a real number", "use 1.0 to disable"]),
    "min_p=[0.1]": (dict(min_p=[0.1]), ["min_p=[0.1]", "a real number", "list"]),
    "stop=[1]": (dict(stop=[1]), ["stop=[1]", "non-string item", "int"]),
    "stop=3": (dict(stop=3), ["stop=3", "a str or a list of str"]),
    "ignore_eos='yes'": (dict(ignore_eos="yes"), ["ignore_eos='yes'", "must be a bool", "True or False"]),
}


BAD_VALUES = {
    "seed=-1": (dict(seed=-1), ["seed=-1", "[0, 2**63 - 1]", "non-negative seed"]),
    "seed=2**63": (dict(seed=2**63), [f"seed={2**63}", "[0, 2**63 - 1]"]),
    "top_k=2**31": (dict(top_k=2**31), [f"top_k={2**31}", f"[-1, {MAX_TOP_K}]", "use 0 or -1"]),
    "top_k=-2": (dict(top_k=-2), ["top_k=-2", "use 0 or -1 to disable"]),
    "logprobs=21": (dict(logprobs=MAX_LOGPROBS + 1), ["logprobs=21", "[0, 20]", "at most 20"]),
    "logprobs=-1": (dict(logprobs=-1), ["logprobs=-1", "[0, 20]"]),
    "temperature=nan": (dict(temperature=math.nan), ["temperature=nan", "finite", "greedy"]),
    "temperature=inf": (dict(temperature=math.inf), ["temperature=inf", "finite"]),
    "top_p=nan": (dict(top_p=math.nan), ["top_p=nan", "finite", "use 1.0 to disable"]),
    "min_p=-inf": (dict(min_p=-math.inf), ["min_p=-inf", "finite", "use 0.0 to disable"]),
    "stop=surrogate": (dict(stop=["ok", "a\ud800"]), ["stop", "cannot be encoded as UTF-8", "surrogate"]),
    "stop=['']": (dict(stop=[""]), ["stop", "remove empty stop strings"]),
    "stop_token_ids=[-3]": (dict(stop_token_ids=[-3]), ["stop_token_ids=[-3]", ">= 0", "remove negative ids"]),
    "max_tokens=0": (dict(max_tokens=0), ["max_tokens=0", ">= 1", "at least one token"]),
}


BAD_PARAMS = {**{name: (TypeError, *case) for name, case in BAD_TYPES.items()},
              **{name: (ValueError, *case) for name, case in BAD_VALUES.items()}}


@pytest.mark.parametrize("name", list(BAD_PARAMS))
def test_bad_sampling_param_is_refused(name, llm, baseline):
    """A wrong type is a TypeError, an out-of-range value a ValueError."""
    error, kwargs, words = BAD_PARAMS[name]
    with pytest.raises(error) as err:
        SamplingParams(**kwargs)
    assert_words(str(err.value), "SamplingParams.", *words)
    assert_still_serving(llm, baseline)


def test_accepted_edges_are_normalised():
    p = SamplingParams(max_tokens=np.int64(3), seed=MAX_SEED, top_k=MAX_TOP_K, logprobs=MAX_LOGPROBS,
                       temperature=1, top_p=np.float32(0.5), stop="x", stop_token_ids=(np.int32(2), 5))
    assert (p.max_tokens, p.seed, p.top_k, p.logprobs) == (3, MAX_SEED, MAX_TOP_K, MAX_LOGPROBS)
    assert type(p.max_tokens) is int and type(p.temperature) is float and p.top_p == 0.5
    assert p.stop == ["x"] and p.stop_token_ids == [2, 5] and all(type(t) is int for t in p.stop_token_ids)
    assert SamplingParams(stop=None, stop_token_ids=None).stop == []


def test_top_k_above_the_vocabulary_filters_nothing(llm):
    """A huge top_k is accepted and samples exactly what top_k=0 samples."""
    def run(top_k):
        params = SamplingParams(temperature=1.0, top_k=top_k, seed=5, max_tokens=12, ignore_eos=True)
        return llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids
    assert run(MAX_TOP_K) == run(0) == run(VOCAB + 1)
    assert run(MAX_TOP_K) != run(2)  # and top-k does filter when it is small


def test_seed_at_the_top_of_the_range_is_served(llm):
    params = SamplingParams(temperature=1.0, seed=MAX_SEED, max_tokens=6, ignore_eos=True)
    first = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids
    assert len(first) == 6 and all(0 <= t < VOCAB for t in first)
    assert llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids == first


# --- tiny temperatures ------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1e-45, 1e-30, 5e-6])
def test_tiny_temperature_is_greedy(temperature, llm, baseline):
    params = SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True, seed=3, logprobs=2)
    assert params.temperature == 0.0 and params.greedy
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == baseline
    assert all(math.isfinite(lp[t]) for lp, t in zip(out.logprobs, out.token_ids))


def test_temperature_at_the_threshold_samples():
    assert SamplingParams(temperature=MIN_TEMPERATURE).temperature == MIN_TEMPERATURE
    assert not SamplingParams(temperature=MIN_TEMPERATURE).greedy


def test_tiny_temperature_with_a_draft_model_is_greedy(llama_dir, spec_noisy_draft_dir, baseline):
    llm = LLM(str(llama_dir), block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
              speculative={"proposer": "draft_model", "proposer_options": {"model": str(spec_noisy_draft_dir)},
                           "num_speculative_tokens": 3})
    out = llm.generate([PROMPT], SamplingParams(temperature=1e-45, max_tokens=8, ignore_eos=True, seed=1),
                       use_tqdm=False)[0]
    assert out.outputs[0].token_ids == baseline


def test_filtered_logprobs_never_overflow_on_tiny_temperatures():
    """Even a temperature set below the threshold after validation (tensors
    built by hand) gives the greedy row's finite distribution, not NaN."""
    logits = torch.randn(3, VOCAB) * 30
    params = [SamplingParams(temperature=0.0), SamplingParams(), SamplingParams()]
    t = sampling_tensors(params, logits.device)
    t["temperature"] = torch.tensor([0.0, 1e-45, 1e-38])
    lp = filtered_logprobs(logits, **t)
    assert torch.isfinite(lp.exp()).all() and not torch.isnan(lp).any()
    assert (lp.argmax(dim=-1) == logits.argmax(dim=-1)).all()


def test_sampler_never_emits_an_id_outside_the_vocabulary():
    probs = torch.rand(5, VOCAB)
    probs[0] = math.nan
    probs[1] = 0.0
    probs[2, 7] = math.inf
    probs[3, :] = 0.0
    probs[3, 11] = math.nan
    uniforms = torch.tensor([0.999999, 0.5, 0.3, 0.0, 0.9999999999], dtype=torch.float64)
    ids = sample_from_probs(probs, uniforms).tolist()
    assert all(0 <= i < VOCAB for i in ids), ids
    assert ids[1] == 0 and ids[2] == probs[2].nan_to_num(posinf=-1).argmax().item()
    ok = torch.zeros(1, VOCAB)
    ok[0, 9] = 2.0
    assert sample_from_probs(ok, torch.tensor([0.999999999], dtype=torch.float64)).tolist() == [9]


# --- prompts -----------------------------------------------------------------------

BAD_PROMPTS = {
    # name: (what generate() receives, exception, words)
    "bool-ids": ([[True, 5, 6]], TypeError, ["item 0 is True", "bool", "integer token ids"]),
    "float-ids": ([[5, 6.0]], TypeError, ["item 1 is 6.0", "float", "integer token ids"]),
    "float-tensor-id": ([[5, torch.tensor(1.5)]], TypeError, ["item 1", "Tensor"]),
    "none-prompt": ([None], TypeError, ["prompt must be a str or a list of int token ids", "NoneType"]),
    "dict-prompt": ({"prompt": "x"}, TypeError, ["prompts must be a str", "got dict", "not a dict"]),
    "dict-in-list": ([{"prompt": "x"}], TypeError, ["prompt must be a str or a list", "dict"]),
    "set-of-prompts": ({"a", "b"}, TypeError, ["prompts must be a str", "got set"]),
    "bytes-prompt": (b"hello", TypeError, ["prompts must be a str", "got bytes"]),
    "none-prompts": (None, TypeError, ["prompts must be a str", "got NoneType"]),
    "lone-surrogate": (["abc\udcffdef"], ValueError, ["'\\udcff' at index 3", "UTF-8", "surrogate"]),
    "nested-ids": ([[[5, 6]]], TypeError, ["item 0 is [5, 6]", "list"]),
}


@pytest.mark.parametrize("name", list(BAD_PROMPTS))
def test_bad_prompt(name, llm, baseline):
    prompts, exc, words = BAD_PROMPTS[name]
    with pytest.raises(exc) as err:
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_words(str(err.value), *words)
    assert_still_serving(llm, baseline)


def test_bad_prompt_through_the_engine_api(llm, baseline):
    with pytest.raises(TypeError, match="item 2 is False"):
        llm.engine.add_request(None, [5, 6, False], GREEDY)
    with pytest.raises(ValueError, match="cannot be encoded as UTF-8"):
        llm.engine.add_request(None, "\ud800", GREEDY)
    assert_still_serving(llm, baseline)


@pytest.mark.parametrize("form", ["tuple", "numpy-ints", "numpy-array-items", "list-of-tuples"])
def test_token_id_prompts_in_other_integer_forms(form, llm, baseline):
    prompts = {
        "tuple": tuple(PROMPT),
        "numpy-ints": [np.int64(t) for t in PROMPT],
        "numpy-array-items": [list(np.array(PROMPT, dtype=np.int32))],
        "list-of-tuples": [tuple(PROMPT), tuple(PROMPT)],
    }[form]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert len(outs) == (2 if form == "list-of-tuples" else 1)
    assert all(o.outputs[0].token_ids == baseline for o in outs)
    assert all(type(t) is int for o in outs for t in o.prompt_token_ids)
