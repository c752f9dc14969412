"""Property: any SamplingParams kwargs and any prompt are either accepted and
served (valid token ids, at most max_tokens of them) or refused with a
TypeError/ValueError that names what is wrong; never an internal error, and
the engine keeps serving afterwards. Which inputs are wrong, the exception type
and what the message must show (the field or prompt and the offending value)
come from the documented rules (``param_problem``, ``prompt_problem``)."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Mapping

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


def _index(v: object) -> int | None:
    """``v`` as a token id / integer option if it is integer-like (not a bool), else None."""
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        return None
    return operator.index(v)


INT_RANGES = {"max_tokens": (1, None), "top_k": (-1, 2**31 - 1), "seed": (0, 2**63 - 1), "logprobs": (0, 20)}
REAL_RANGES = {"temperature": (0.0, None, True), "top_p": (0.0, 1.0, False), "min_p": (0.0, 1.0, True)}


def param_problem(name: str, v: object) -> tuple[type[Exception], str] | None:
    """What SamplingParams' docs say ``name=v`` alone must raise (TypeError for a wrong type,
    ValueError for a value out of range) and the part of the message that shows the value;
    None for a valid value. Written from the documented rules, not from the code."""
    if name in INT_RANGES:
        if v is None and name in ("seed", "logprobs"):
            return None
        i = _index(v)
        if i is None:
            return TypeError, f"SamplingParams.{name}={v!r}"
        lo, hi = INT_RANGES[name]
        return None if lo <= i and (hi is None or i <= hi) else (ValueError, f"SamplingParams.{name}={i!r}")
    if name in REAL_RANGES:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            return TypeError, f"SamplingParams.{name}={v!r}"
        if not math.isfinite(float(v)):
            return ValueError, f"SamplingParams.{name}={v!r}"
        lo, hi, lo_ok = REAL_RANGES[name]
        f = float(v)
        ok = (f >= lo if lo_ok else f > lo) and (hi is None or f <= hi)
        return None if ok else (ValueError, f"SamplingParams.{name}={f!r}")
    if name in ("ignore_eos", "include_stop_str_in_output"):
        return None if isinstance(v, bool) else (TypeError, f"SamplingParams.{name}={v!r}")
    if v is None:
        return None
    if name == "stop":
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, (list, tuple)):
            return TypeError, f"SamplingParams.stop={v!r}"
        for s in items:
            if not isinstance(s, str):
                return TypeError, f"SamplingParams.stop={list(items)!r}"
            if not s:
                return ValueError, f"SamplingParams.stop={list(items)!r}"
            if any(0xD800 <= ord(c) <= 0xDFFF for c in s):
                return ValueError, f"SamplingParams.stop contains {s!r}"
        return None
    assert name == "stop_token_ids"
    if not isinstance(v, (list, tuple)):
        return TypeError, f"SamplingParams.stop_token_ids={v!r}"
    ids = [_index(t) for t in v]
    for t, i in zip(v, ids):
        if i is None:
            return TypeError, f"SamplingParams.stop_token_ids={t!r}"
    return None if all(i >= 0 for i in ids) else (ValueError, f"SamplingParams.stop_token_ids={ids!r}")


def prompt_problem(tokenizer, prompts) -> tuple[type[Exception], list[str]] | None:
    """What ``LLM.generate`` is documented to raise for ``prompts`` (TypeError for a wrong type,
    ValueError for a bad value; the message names the prompt and shows what is wrong), or None."""
    if isinstance(prompts, str):
        prompts = [prompts]
    elif isinstance(prompts, (Mapping, set, frozenset, bytes, bytearray)) or not isinstance(prompts, Iterable):
        return TypeError, ["prompts must be", f"got {type(prompts).__name__}"]
    elif isinstance(prompts, (list, tuple)) and prompts and hasattr(type(prompts[0]), "__index__"):
        prompts = [prompts]  # one prompt of token ids: its first item is integer-like (a bool too)
    for n, p in enumerate(prompts):
        where = f"prompt {n}: "
        if isinstance(p, str):
            bad = [c for c in p if 0xD800 <= ord(c) <= 0xDFFF]
            if bad:
                return ValueError, [where, f"contains {bad[0]!r}"]
            ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        elif isinstance(p, (list, tuple)):
            for j, t in enumerate(p):
                if _index(t) is None:
                    return TypeError, [where, f"item {j} is {t!r}"]
            ids = [_index(t) for t in p]
            outside = [t for t in ids if not 0 <= t < VOCAB]
            if outside:
                return ValueError, [where, f"prompt token ids {outside[:5]}"]
        else:
            return TypeError, [where, f"got {type(p).__name__}"]
        if not ids:
            return ValueError, [where, "prompt is empty"]
        if len(ids) >= MAX_MODEL_LEN:
            return ValueError, [where, f"prompt has {len(ids)} tokens", f"max_model_len is {MAX_MODEL_LEN}"]
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(kwargs=sampling_kwargs, prompt=prompts)
def test_inputs_are_served_or_clearly_refused(llm, baseline, kwargs, prompt):
    wrong = {k: p for k in kwargs if (p := param_problem(k, kwargs[k])) is not None}
    try:
        params = SamplingParams(**kwargs)
    except Exception as exc:  # noqa: BLE001 - which exception, and what it says, is the point
        assert wrong, f"valid SamplingParams{kwargs} refused: {exc!r}"
        # the documented type (exactly: not a subclass), naming a field that is wrong and its value
        assert any(type(exc) is t and text in str(exc) for t, text in wrong.values()), (repr(exc), wrong)
        event("params refused")
        params = GREEDY
    else:
        assert not wrong, f"SamplingParams accepted {wrong}"
    expected = prompt_problem(llm.tokenizer, prompt)
    try:
        outs = llm.generate(prompt, params, use_tqdm=False)
    except Exception as exc:  # noqa: BLE001
        assert expected, f"valid prompt {prompt!r} refused: {exc!r}"
        exc_type, texts = expected
        assert type(exc) is exc_type and all(t in str(exc) for t in texts), (repr(exc), expected)
        event("prompt refused")
    else:
        assert not expected, f"prompt {prompt!r} served, expected {expected}"
        event("served")
        for out in outs:
            ids = out.outputs[0].token_ids
            assert 1 <= len(ids) <= params.max_tokens
            assert all(type(t) is int and 0 <= t < VOCAB for t in ids), ids
            assert len(out.prompt_token_ids) + len(ids) <= MAX_MODEL_LEN
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == baseline
