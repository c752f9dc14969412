"""Schemas and grammars of the structured-output tests, and how to check an output.

The tiny random models write garbage, so every valid output here is the
grammar mask's doing. The schemas are bounded (lengths, ranges, enums, no
extra properties) so that outputs close well within ``max_tokens``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import jsonschema

from speculant import LLM, SamplingParams

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "ok": {"type": "boolean"},
        "kind": {"enum": ["red", "green", "blue"]},
        "inner": {"type": "object", "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 5},
                                                   "note": {"type": ["string", "null"], "maxLength": 4}},
                  "required": ["n", "note"], "additionalProperties": False}},
        "required": ["ok", "kind", "inner"], "additionalProperties": False},
    "list": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1,
             "maxItems": 4},
    "either": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "integer", "minimum": 0, "maximum": 9},
                         {"type": "object", "properties": {"v": {"const": 1}}, "required": ["v"],
                          "additionalProperties": False}]},
}

REGEX = r"[a-z]{2,5}@[a-z]{2,4}\.(com|org)"
LARK = """
start: greeting " " name "!"
greeting: "hello" | "hi" | "hey"
name: /[a-z]{1,6}/
"""
LARK_AS_REGEX = r"(hello|hi|hey) [a-z]{1,6}!"


def check_json(text: str, schema: dict) -> None:
    """``text`` is one JSON value valid under ``schema`` (raises with the reason otherwise)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"output {text!r} is not JSON: {exc}") from None
    jsonschema.validate(value, schema)


def check_regex(text: str, pattern: str) -> None:
    assert re.fullmatch(pattern, text), f"output {text!r} does not match {pattern!r}"


def run(llm: LLM, prompts: Sequence[list[int]], params: SamplingParams | Sequence[SamplingParams],
        max_steps: int = 4000):
    """The outputs of ``prompts`` in order, through the engine, failing instead of looping forever
    (as tests/spec/spec_helpers.py's ``run``)."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    eng = llm.engine
    ids = [eng.add_request(None, list(p), sp) for p, sp in zip(prompts, params)]
    done: dict = {}
    for _ in range(max_steps):
        if not eng.has_unfinished_requests():
            break
        done.update({o.request_id: o for o in eng.step() if o.finished})
    assert not eng.has_unfinished_requests(), f"engine still has unfinished requests after {max_steps} steps"
    return [done[i] for i in ids]
