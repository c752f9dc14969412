"""From a validated request (``protocol.py``) to what the engine takes: the
prompt, the chat messages, and ``SamplingParams``.

The raw-value helpers (``one_prompt``, ``structured_of``) also explain, for
``explain.py``, why a value the schema refused is wrong, so the server and
its error messages share one set of rules.
"""

from __future__ import annotations

from typing import Any

from speculant.config.sampling_params import SamplingParams
from speculant.server.errors import CONFLICTING_PARAMETERS, INVALID_STRUCTURED_OUTPUT, APIError
from speculant.server.protocol import ChatCompletionRequest, CompletionRequest

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
                    "include_stop_str_in_output", "speculative")


def one_prompt(prompt: Any) -> str | list[int]:
    """The one prompt of a completion request; 400 for anything else."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"prompt holds {len(prompt)} prompts; this server takes one prompt per "
                                "request: send one request per prompt", param="prompt")
        prompt = prompt[0]
    if not isinstance(prompt, (str, list)):
        raise APIError(400, f"prompt must be a string or a list of token ids, got {type(prompt).__name__}",
                       param="prompt")
    if not prompt:
        raise APIError(400, "prompt is empty (0 tokens); pass at least one token", param="prompt")
    return prompt


def prompt_of(req: CompletionRequest) -> str | list[int]:
    return one_prompt(req.prompt)


def messages_of(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as ``speculant.chat`` takes them, OpenAI's content-part
    lists (``[{"type": "text", ...}]``) joined into plain text."""
    out = []
    for msg in req.messages:
        content = msg.content if isinstance(msg.content, str) else "".join(p.text for p in msg.content)
        item = {"role": msg.role, "content": content}
        if msg.name is not None:
            item["name"] = msg.name
        out.append(item)
    return out


def sampling_params(req: CompletionRequest | ChatCompletionRequest, default_max_tokens: int) -> SamplingParams:
    """The request's SamplingParams; a value it refuses is a 400 with its message."""
    kwargs: dict[str, Any] = {f: getattr(req, f) for f in _SAMPLING_FIELDS if getattr(req, f) is not None}
    if req.speculative is not None:  # only the keys the client sent: SamplingParams checks them
        kwargs["speculative"] = req.speculative.model_dump(exclude_unset=True)
    max_tokens = req.max_tokens
    if isinstance(req, ChatCompletionRequest):
        if req.max_completion_tokens is not None:
            if max_tokens is not None and max_tokens != req.max_completion_tokens:
                raise APIError(400, f"max_tokens={max_tokens!r} and max_completion_tokens="
                                    f"{req.max_completion_tokens!r} disagree; send one of them",
                               param="max_completion_tokens", code=CONFLICTING_PARAMETERS)
            max_tokens = req.max_completion_tokens
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs",
                           code=CONFLICTING_PARAMETERS)
        if req.logprobs:
            kwargs["logprobs"] = req.top_logprobs if req.top_logprobs is not None else 0
    elif req.logprobs is not None:
        kwargs["logprobs"] = req.logprobs
    kwargs["max_tokens"] = max_tokens if max_tokens is not None else default_max_tokens
    fmt = None if req.response_format is None else req.response_format.model_dump(by_alias=True, exclude_unset=True)
    ext = None if req.structured_outputs is None else req.structured_outputs.model_dump(exclude_unset=True)
    structured = structured_of(fmt, ext)
    if structured is not None:
        kwargs["structured"] = structured
    try:
        return SamplingParams(**kwargs)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        if ".structured" not in message:
            raise APIError(400, message, param=sampling_param(message, req)) from None
        param = "structured_outputs" if ext is not None else "response_format"
        raise APIError(400, message, param=param, code=INVALID_STRUCTURED_OUTPUT) from None


def sampling_param(message: str, req: object) -> str | None:
    """The request field a ``SamplingParams`` message is about."""
    if not message.startswith("SamplingParams."):
        return None
    param = message.removeprefix("SamplingParams.").split("=")[0].split(" ")[0]
    if param == "logprobs" and isinstance(req, ChatCompletionRequest):
        return "top_logprobs"
    return param


def structured_of(fmt: Any, ext: Any) -> Any:
    """``SamplingParams.structured`` from raw ``response_format`` / ``structured_outputs`` (400 if both)."""
    if ext is not None:
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            raise APIError(400, "response_format and structured_outputs both constrain the output; send one",
                           param="structured_outputs", code=CONFLICTING_PARAMETERS)
        return ext
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text" and len(fmt) == 1:
        return None
    if kind == "json_object" and len(fmt) == 1:
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        unknown = set(fmt) - {"type", "json_schema"}
        if not isinstance(spec, dict) or unknown:
            raise APIError(400, f"response_format {fmt!r}: json_schema must be an object "
                                '{"name": ..., "schema": {...}, "strict": ...}', param="response_format")
        extra = set(spec) - {"name", "schema", "strict", "description"}
        if extra or not isinstance(spec.get("name"), str) or "schema" not in spec:
            why = f"has unknown keys {sorted(extra)}" if extra else "needs a string name and a schema"
            raise APIError(400, f"response_format.json_schema {why}: send "
                                '{"name": "...", "schema": {...}, "strict": true}', param="response_format")
        return {"json_schema": spec["schema"]}
    raise APIError(400, f"response_format {fmt!r} is not supported: send {{\"type\": \"json_object\"}}, "
                        '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}} or {"type": "text"}',
                   param="response_format")
