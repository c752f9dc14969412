"""Whether a text cut short (``max_tokens``) is the start of a JSON value a
schema accepts, checked without the engine's grammar matcher: the text is
closed by hand (an escape finished, a string closed, a key given a value, a
literal or number finished, the open brackets closed) and the result parsed
and validated with ``jsonschema``."""

from __future__ import annotations

import json

import jsonschema

# what may finish a value, a key or a separator left open at the cut, tried in turn
_TAILS = ("", "0", ": 0", '"": 0', "rue", "ue", "e", "alse", "lse", "se", "ull", "ll", "l")


def _open(text: str) -> tuple[bool, bool, str]:
    """(inside a string, right after a backslash in it, the brackets that close what is open)."""
    in_str, esc, stack = False, False, []
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}":
            assert stack and stack.pop() == ch, f"output {text!r} closes a bracket it never opened"
    return in_str, esc, "".join(reversed(stack))


def check_json_prefix(text: str, schema: dict) -> None:
    """``text`` is the start of a JSON value ``schema`` accepts (raises otherwise). The closing
    adds no properties: for schemas a closed prefix can meet (``{"type": "object"}``)."""
    in_str, esc, closers = _open(text)
    head = text + ("n" if esc else "") + ('"' if in_str else "")
    for tail in _TAILS:
        try:
            value = json.loads(head + tail + closers)
        except json.JSONDecodeError:
            continue
        if jsonschema.Draft202012Validator(schema).is_valid(value):
            return
    raise AssertionError(f"output {text!r} starts no JSON value valid under {schema}")
