"""Why a request field was refused, in the words of the check that owns it.

The request models (``protocol.py``) decide what is valid; pydantic's own
wording (``Input should be less than or equal to 20``) says little about the
fix. For the fields whose rules live elsewhere, ``explain(field, value)``
asks that code for its message: ``SamplingParams`` for the sampling options
(the same message the offline API raises), the prompt and chat checks, and
the reasons an unimplemented OpenAI feature is refused. None: no better
words than pydantic's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.exceptions import RequestValidationError

from speculant.chat import as_conversations
from speculant.config.sampling_params import SamplingParams
from speculant.server.errors import APIError
from speculant.server.request_params import one_prompt, structured_of

SAMPLING_OPTIONS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                    "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
                    "stop_token_ids": "stop_token_ids", "ignore_eos": "ignore_eos",
                    "include_stop_str_in_output": "include_stop_str_in_output", "top_logprobs": "logprobs",
                    "structured_outputs": "structured"}
"""Request field -> the ``SamplingParams`` option that checks it."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unsupported(field: str, value: Any) -> str | None:
    """The reason an OpenAI feature Speculant does not implement is refused."""
    if field == "n" and _number(value):
        return f"n={value}: only n=1 is supported (one choice per request); send the request n times with " \
               "different seeds instead"
    if field in ("presence_penalty", "frequency_penalty") and _number(value):
        return f"{field}={value}: penalties are not implemented; omit it or pass 0"
    if field == "logit_bias" and isinstance(value, dict):
        return "logit_bias is not implemented; omit it"
    if field == "echo" and value is True:
        return "echo=true is not implemented; omit it"
    if field == "best_of" and _number(value):
        return f"best_of={value}: only best_of=1 is supported"
    if field == "suffix" and isinstance(value, str):
        return "suffix (insertion) is not implemented; omit it"
    return None


def _sampling(option: str, value: Any) -> str | None:
    try:
        SamplingParams(**{option: value})
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def _raised(check: Callable[[], object]) -> str | None:
    try:
        check()
    except (APIError, TypeError, ValueError) as exc:
        return exc.message if isinstance(exc, APIError) else str(exc)
    return None


def _messages(value: Any) -> str | None:
    if isinstance(value, list):  # content-part lists as the server joins them
        value = [{**m, "content": "".join(p["text"] for p in m["content"] if isinstance(p, dict)
                                          and isinstance(p.get("text"), str))}
                 if isinstance(m, dict) and isinstance(m.get("content"), list) else m for m in value]
    return _raised(lambda: as_conversations(value))


def explain(field: str, value: Any, chat: bool) -> str | None:
    """Why ``value`` is refused for the top-level request ``field``; None if no check says more than pydantic."""
    reason = _unsupported(field, value)
    if reason is not None:
        return reason
    if field == "logprobs" and not chat:
        return _sampling("logprobs", value)
    if field in SAMPLING_OPTIONS:
        return _sampling(SAMPLING_OPTIONS[field], value)
    if field == "prompt":
        return _raised(lambda: one_prompt(value))
    if field == "messages":
        return _messages(value)
    if field == "response_format":
        return _raised(lambda: structured_of(value, None))
    return None


def _pydantic_words(field: str, err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"unknown field {field!r}; remove it (see the API reference, /docs, for the fields this endpoint " \
               "accepts)"
    if kind == "missing":
        return f"field {field!r} is required"
    return f"field {field!r}: {err.get('msg', 'invalid value')} (got {err.get('input')!r})"


def validation_message(exc: RequestValidationError, chat: bool) -> tuple[str, str | None]:
    """One readable sentence per refused field of the body, and the first such field (OpenAI's ``param``)."""
    body = getattr(exc, "body", None)
    groups: dict[str, list[dict[str, Any]]] = {}
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx", {}).get("error", "")
            return f"the request body is not valid JSON ({ctx} at character {'.'.join(loc)}); send a JSON object", None
        if not loc and err.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            return "the request body must be a JSON object", None
        groups.setdefault(loc[0] if loc else "body", []).append(err)
    parts = []
    for top, errs in groups.items():
        value = body.get(top) if isinstance(body, dict) else None
        known = isinstance(body, dict) and top in body and errs[0].get("type") != "extra_forbidden"
        reason = explain(top, value, chat) if known else None
        if reason is None:
            words = [_pydantic_words(".".join(str(x) for x in e["loc"] if x != "body"), e) for e in errs]
            reason = words[0] if len(words) == 1 else \
                f"field {top!r} is none of its allowed forms ({'; '.join(words[:4])})"
        parts.append(reason)
    return "; ".join(parts) or "invalid request", next(iter(groups), None)
