"""Input lines of a batch job -> engine requests, with a clear reason for each bad line.

A line is one JSON object: ``{"id": ..., "prompt": "..."}`` (text, or a list
of token ids, which the engine checks) or ``{"id": ...,
"messages": [{"role": ..., "content": ...}, ...]}``, plus optional sampling
fields under OpenAI's names (``max_tokens`` or ``max_completion_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop``) and vLLM's extensions
(``top_k``, ``min_p``, ``stop_token_ids``, ``ignore_eos``,
``include_stop_str_in_output``). The defaults are the server's: greedy is
not the default (``temperature`` 1, as OpenAI's), ``max_tokens`` is 16 for a
prompt and up to ``max_model_len`` for messages.

``id`` is a string or an integer, unique in the file: a rerun skips the ids
already answered. A line that cannot run (not JSON, no id, neither or both of
prompt and messages, an unknown field, a value ``SamplingParams`` refuses)
raises ``BadLine`` with the reason; the job writes it as an error record and
goes on. Messages are rendered with the model's chat template exactly as
``LLM.chat`` and the server do (OpenAI's text content parts joined).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from speculant.chat import as_conversations, render
from speculant.config.sampling_params import SamplingParams

PROMPT_DEFAULT_MAX_TOKENS = 16  # OpenAI's /v1/completions default, as the server
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
                   "include_stop_str_in_output", "speculative")
KNOWN_FIELDS = frozenset({"id", "prompt", "messages", "max_tokens", "max_completion_tokens", *SAMPLING_FIELDS})

LineId = str | int


class BadLine(ValueError):
    """A line that cannot run; ``id`` is its id when one could be read."""

    def __init__(self, message: str, line_id: LineId | None = None) -> None:
        super().__init__(message)
        self.id = line_id


@dataclass(frozen=True)
class InputLine:
    """One non-blank line of the input file, as read (1-based ``number``)."""

    number: int
    text: str


def read_lines(path: str) -> list[InputLine]:
    """The non-blank lines of ``path`` (blank lines are no records and get none)."""
    with open(path, encoding="utf-8") as f:
        return [InputLine(n, text.rstrip("\n")) for n, text in enumerate(f, 1) if text.strip()]


def parse_object(line: InputLine) -> dict[str, Any]:
    """The line's JSON object with a valid id, or BadLine."""
    try:
        obj = json.loads(line.text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"line {line.number}: not valid JSON ({exc.msg} at column {exc.colno}); each line must "
                      "be one JSON object such as {\"id\": \"a\", \"prompt\": \"...\"}") from None
    if not isinstance(obj, dict):
        raise BadLine(f"line {line.number}: a line must be a JSON object, got a JSON {type(obj).__name__}")
    line_id = obj.get("id")
    if isinstance(line_id, bool) or not isinstance(line_id, (str, int)):
        raise BadLine(f"line {line.number}: 'id' must be a string or an integer, unique in the file (a rerun "
                      f"skips the ids already answered), got {line_id!r}")
    return obj


def line_id_of(line: InputLine) -> LineId | None:
    """The line's id, or None when it has none that can be read."""
    try:
        return parse_object(line)["id"]
    except BadLine:
        return None


@dataclass(frozen=True)
class BatchRequest:
    id: LineId
    prompt: str | list[int]
    params: SamplingParams


def to_request(line: InputLine, tokenizer: Any, max_model_len: int) -> BatchRequest:
    """The line as an engine request, or BadLine naming the line, the field and the fix."""
    obj = parse_object(line)
    line_id = obj["id"]
    where = f"line {line.number} (id {line_id!r})"
    unknown = sorted(set(obj) - KNOWN_FIELDS)
    if unknown:
        raise BadLine(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; a line takes "
                      f"{', '.join(sorted(KNOWN_FIELDS))}", line_id)
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise BadLine(f"{where}: give exactly one of 'prompt' (a string) or 'messages' (a list of "
                      f"{{'role', 'content'}}), got {'both' if has_prompt else 'neither'}", line_id)
    try:
        if has_prompt:
            if not isinstance(obj["prompt"], (str, list)):
                raise TypeError(f"'prompt' must be a string or a list of token ids, got "
                                f"{type(obj['prompt']).__name__}")
            prompt, default_max = obj["prompt"], PROMPT_DEFAULT_MAX_TOKENS
        else:
            conversations, single = as_conversations(_joined(obj["messages"]))
            if not single:
                raise TypeError("'messages' must be one conversation (a list of message dicts)")
            prompt, default_max = render(tokenizer, conversations[0]), max_model_len
        params = SamplingParams(max_tokens=_max_tokens(obj, default_max),
                                **{f: obj[f] for f in SAMPLING_FIELDS if obj.get(f) is not None})
    except (TypeError, ValueError) as exc:
        raise BadLine(f"{where}: {exc}", line_id) from None
    return BatchRequest(line_id, prompt, params)


def _max_tokens(obj: dict[str, Any], default: int) -> Any:
    a, b = obj.get("max_tokens"), obj.get("max_completion_tokens")
    if a is not None and b is not None and a != b:
        raise ValueError(f"max_tokens={a!r} and max_completion_tokens={b!r} disagree; send one of them")
    return a if a is not None else b if b is not None else default


def _joined(messages: Any) -> Any:
    """OpenAI's text content parts (``[{"type": "text", "text": ...}]``) joined into plain text."""
    if not isinstance(messages, list):
        return messages
    out = []
    for m, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ValueError(f"messages[{m}].content: only text parts ({{'type': 'text', 'text': ...}}) "
                                 "are supported")
            msg = {**msg, "content": "".join(p["text"] for p in content)}
        out.append(msg)
    return out
