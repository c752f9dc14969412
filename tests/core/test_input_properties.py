"""Property: any SamplingParams kwargs and any prompt are either accepted and
served (valid token ids, at most max_tokens of them) or refused with a
TypeError/ValueError that names what is wrong; never an internal error, and
the engine keeps serving afterwards."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from speculant import LLM, SamplingParams
from tiny_models import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 384
MAX_MODEL_LEN = 24
PROMPT = random_prompts([6], seed=61)[0]
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
FIELDS = ["max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "stop_token_ids",
          "ignore_eos", "logprobs", "include_stop_str_in_output"]

junk = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-5, max_value=40), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=0, max_value=1),
    st.sampled_from([1e-45, 1e-6, 1e-5, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 20, 21, -1, math.nan, -math.inf]),
    st.text(max_size=4), st.just("\ud800"),
    st.lists(st.one_of(st.integers(-3, 500), st.text(max_size=3), st.booleans(), st.floats()), max_size=3),
    st.builds(np.int64, st.integers(-3, 30)), st.builds(np.float32, st.floats(0, 2, width=32)),
)
VALID = {  # values that should be accepted, to mix with the junk
    "max_tokens": st.integers(1, 40),
    "temperature": st.one_of(st.floats(0, 2), st.sampled_from([0, 1e-45, 1e-6, 1e-5])),
    "top_k": st.one_of(st.integers(-1, 500), st.just(2**31 - 1)),
    "top_p": st.floats(0.01, 1),
    "min_p": st.floats(0, 1),
    "seed": st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    "stop": st.one_of(st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=2)),
    "stop_token_ids": st.lists(st.integers(0, 500), max_size=3),
    "ignore_eos": st.booleans(),
    "logprobs": st.one_of(st.none(), st.integers(0, 20)),
    "include_stop_str_in_output": st.booleans(),
}
sampling_kwargs = st.lists(st.sampled_from(FIELDS), unique=True, max_size=5).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.one_of(VALID[k], VALID[k], VALID[k], junk) for k in keys}))
valid_prompts = st.one_of(st.text(min_size=1, max_size=30),
                          st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12))
prompts = st.one_of(
    valid_prompts, valid_prompts, valid_prompts, st.lists(valid_prompts, min_size=1, max_size=3),
    st.text(max_size=30), st.just("x\udc80y"), st.just(""),
    st.lists(st.integers(-2, VOCAB + 2), max_size=MAX_MODEL_LEN + 2),
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12).map(tuple),
    st.lists(st.sampled_from([True, 1.5, None, "a", np.int32(7), np.int64(400)]), min_size=1, max_size=3),
    st.none(), st.just({"prompt": "x"}), st.integers(), st.floats(),
)


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(str(llama_dir), block_size=4, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def baseline(llm):
    return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(kwargs=sampling_kwargs, prompt=prompts)
def test_inputs_are_served_or_clearly_refused(llm, baseline, kwargs, prompt):
    try:
        params = SamplingParams(**kwargs)
    except (TypeError, ValueError) as exc:
        assert "SamplingParams." in str(exc), str(exc)
        event("params refused")
        params = GREEDY
    try:
        outs = llm.generate(prompt, params, use_tqdm=False)
    except (TypeError, ValueError) as exc:
        assert "prompt" in str(exc), str(exc)
        event("prompt refused")
    else:
        event("served")
        for out in outs:
            ids = out.outputs[0].token_ids
            assert 1 <= len(ids) <= params.max_tokens
            assert all(type(t) is int and 0 <= t < VOCAB for t in ids), ids
            assert len(out.prompt_token_ids) + len(ids) <= MAX_MODEL_LEN
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == baseline
