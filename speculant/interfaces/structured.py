"""What a structured-output request asks for, validated for its shape.

``SamplingParams(structured=...)`` takes exactly one of

- ``{"json_schema": <dict or JSON text>}``: output is JSON valid under the schema;
- ``{"json_object": True}``: output is one JSON object (any keys);
- ``{"regex": <str>}``: output matches the regular expression (whole output);
- ``{"grammar": <str>}``: output is a sentence of the Lark grammar (llguidance's
  Lark dialect, ``start`` rule).

This module checks only the shape (types, one key, JSON that parses). Whether
the grammar compiles is decided by the engine, which owns the tokenizer
(``engine/grammar/compiler.py``); its error names the problem the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

StructuredKind = Literal["json_schema", "json_object", "regex", "grammar"]
STRUCTURED_KINDS: tuple[StructuredKind, ...] = ("json_schema", "json_object", "regex", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    """One validated structured-output constraint.

    ``source`` is the canonical text: the schema as compact JSON text (key
    order kept: it is the order properties are generated in), the regex or
    the Lark grammar as given, "" for ``json_object``. ``(kind, source)`` keys
    the engine's cache of compiled grammars.
    """

    kind: StructuredKind
    source: str

    def as_dict(self) -> dict[str, object]:
        """The form ``SamplingParams(structured=...)`` takes."""
        if self.kind == "json_object":
            return {"json_object": True}
        if self.kind == "json_schema":
            return {"json_schema": json.loads(self.source)}
        return {self.kind: self.source}


def parse_structured(value: object) -> StructuredOutput | None:
    """``value`` (a dict as documented above, a ``StructuredOutput`` or None)
    as a ``StructuredOutput``; TypeError / ValueError name the problem and the fix."""
    if value is None or isinstance(value, StructuredOutput):
        return value
    example = 'structured={"json_schema": {...}} (or "json_object": True, "regex": "...", "grammar": "...")'
    if not isinstance(value, dict):
        raise TypeError(f"SamplingParams.structured={value!r} must be a dict, got {type(value).__name__}; "
                        f"pass {example}.")
    keys = list(value)
    unknown = [k for k in keys if k not in STRUCTURED_KINDS]
    if unknown or len(keys) != 1:
        why = f"has unknown key(s) {unknown}" if unknown else f"has {len(keys)} keys {keys}"
        raise ValueError(f"SamplingParams.structured={value!r} {why}; it takes exactly one of "
                         f"{list(STRUCTURED_KINDS)}: pass {example}.")
    kind = keys[0]
    body = value[kind]
    if kind == "json_object":
        if body is not True:
            raise ValueError(f"SamplingParams.structured={{'json_object': {body!r}}} must be True; pass "
                             "{'json_object': True} for any JSON object, or leave structured unset.")
        return StructuredOutput("json_object", "")
    if kind == "json_schema":
        return StructuredOutput("json_schema", _schema_text(body))
    if not isinstance(body, str) or not body.strip():
        raise ValueError(f"SamplingParams.structured={{{kind!r}: {body!r}}} must be a non-empty str; pass the "
                         f"{'regular expression' if kind == 'regex' else 'Lark grammar'} as text.")
    try:
        body.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"SamplingParams.structured[{kind!r}] cannot be encoded as UTF-8 ({exc.reason} at "
                         f"index {exc.start}); remove the lone surrogate characters.") from None
    return StructuredOutput("regex" if kind == "regex" else "grammar", body)


def _schema_text(body: object) -> str:
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ValueError(f"SamplingParams.structured['json_schema'] is not valid JSON ({exc.msg} at line "
                             f"{exc.lineno} column {exc.colno}); pass the schema as a dict or as JSON text.") from None
    if isinstance(body, bool):  # JSON Schema allows true / false, which constrain nothing / everything
        raise ValueError(f"SamplingParams.structured['json_schema']={body!r} is a boolean schema; pass an object "
                         "schema such as {'type': 'object', 'properties': {...}}.")
    if not isinstance(body, dict):
        raise TypeError(f"SamplingParams.structured['json_schema'] must be a JSON object (a dict), got "
                        f"{type(body).__name__}; pass e.g. {{'type': 'object', 'properties': {{...}}}}.")
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"SamplingParams.structured['json_schema'] cannot be written as JSON ({exc}); use only "
                         "dicts, lists, str, finite numbers, bools and None in the schema.") from None
