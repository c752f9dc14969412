"""Request bodies of the OpenAI-compatible endpoints, and their SamplingParams.

Unknown fields are refused (400), so a misspelled option is never ignored.
The sampling fields are typed ``Any`` on purpose: ``SamplingParams`` checks
them on construction, so the server answers a bad value with the same
message the offline API raises (``SamplingParams.top_p=1.5 must be in (0, 1];
...``). OpenAI fields Speculant does not implement are accepted only at their
no-op value (``n=1``, ``best_of=1``, ``echo=false``, no penalties, no
``logit_bias``, no ``suffix``) and refused otherwise with the reason.

Extensions (vLLM's names, sent with the ``openai`` client's ``extra_body``):
``top_k``, ``min_p``, ``ignore_eos``, ``stop_token_ids``,
``include_stop_str_in_output``, ``structured_outputs`` (one of
``{"json_schema": ...}``, ``{"json_object": true}``, ``{"regex": ...}``,
``{"grammar": ...}``: ``SamplingParams.structured``).

Structured output: ``response_format`` ``{"type": "json_object"}`` or
``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
"strict": ...}}`` (``{"type": "text"}``: none), on both endpoints. A schema
or grammar the engine cannot compile is a 400 naming the problem.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from speculant.config.sampling_params import SamplingParams
from speculant.server.errors import APIError


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    """Send one last chunk with ``usage`` (and no choices) before ``[DONE]``."""


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    """The served model name (``GET /v1/models``); omitted means that model."""
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    max_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None
    min_p: Any = None
    seed: Any = None
    stop: Any = None
    stop_token_ids: Any = None
    ignore_eos: Any = None
    include_stop_str_in_output: Any = None
    response_format: Any = None
    structured_outputs: Any = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: StrictStr | None = None
    """Accepted and ignored (OpenAI uses it for abuse monitoring)."""

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, reason) for each OpenAI feature asked for that Speculant does not implement."""
        out = []
        if self.n != 1:
            out.append(("n", f"n={self.n}: only n=1 is supported (one choice per request); send the "
                             "request n times with different seeds instead"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                out.append((name, f"{name}={getattr(self, name)}: penalties are not implemented; "
                                  "omit it or pass 0"))
        if self.logit_bias:
            out.append(("logit_bias", "logit_bias is not implemented; omit it"))
        return out


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: Any
    """A string, a list of token ids, or a list holding one of those."""
    logprobs: Any = None
    """How many top log-probabilities to return per token (0-20); null for none."""
    echo: StrictBool = False
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.echo:
            out.append(("echo", "echo=true is not implemented; omit it"))
        if self.best_of not in (None, 1):
            out.append(("best_of", f"best_of={self.best_of}: only best_of=1 is supported"))
        if self.suffix:
            out.append(("suffix", "suffix (insertion) is not implemented; omit it"))
        return out


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Any = None
    """OpenAI's newer name for ``max_tokens``; the two must not disagree."""
    logprobs: StrictBool = False
    top_logprobs: Any = None
    """With ``logprobs=true``: how many alternatives per token (0-20)."""


def prompt_of(req: CompletionRequest) -> str | list[int]:
    """The one prompt of a completion request (the engine checks its contents)."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"prompt holds {len(prompt)} prompts; this server takes one prompt per "
                                "request: send one request per prompt", param="prompt")
        prompt = prompt[0]
    if not isinstance(prompt, (str, list)):
        raise APIError(400, f"prompt must be a string or a list of token ids, got {type(prompt).__name__}",
                       param="prompt")
    return prompt


def messages_of(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages with OpenAI's content-part lists (``[{"type": "text", ...}]``)
    joined into plain text; ``speculant.chat`` checks the rest."""
    out = []
    for m, msg in enumerate(req.messages):
        content = msg.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise APIError(400, f"messages[{m}].content: only text parts ({{'type': 'text', 'text': "
                                        f"...}}) are supported, got {part!r}", param=f"messages.{m}.content")
                texts.append(part["text"])
            msg = {**msg, "content": "".join(texts)}
        out.append(msg)
    return out


_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
                    "include_stop_str_in_output")


def sampling_params(req: CompletionRequest | ChatCompletionRequest, default_max_tokens: int) -> SamplingParams:
    """The request's SamplingParams; a value it refuses is a 400 with its message."""
    for field_name, reason in req.unsupported():
        raise APIError(400, reason, param=field_name)
    kwargs: dict[str, Any] = {f: getattr(req, f) for f in _SAMPLING_FIELDS if getattr(req, f) is not None}
    max_tokens = req.max_tokens
    if isinstance(req, ChatCompletionRequest):
        if req.max_completion_tokens is not None:
            if max_tokens is not None and max_tokens != req.max_completion_tokens:
                raise APIError(400, f"max_tokens={max_tokens!r} and max_completion_tokens="
                                    f"{req.max_completion_tokens!r} disagree; send one of them",
                               param="max_completion_tokens")
            max_tokens = req.max_completion_tokens
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        if req.logprobs:
            kwargs["logprobs"] = req.top_logprobs if req.top_logprobs is not None else 0
    elif req.logprobs is not None:
        kwargs["logprobs"] = req.logprobs
    kwargs["max_tokens"] = max_tokens if max_tokens is not None else default_max_tokens
    structured = structured_of(req)
    if structured is not None:
        kwargs["structured"] = structured
    try:
        return SamplingParams(**kwargs)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        param: str | None = None
        if message.startswith("SamplingParams."):
            param = message.removeprefix("SamplingParams.").split("=")[0].split(" ")[0]
            if param == "logprobs" and isinstance(req, ChatCompletionRequest):
                param = "top_logprobs"
        if param is not None and param.startswith("structured"):
            param = "structured_outputs" if req.structured_outputs is not None else "response_format"
        raise APIError(400, message, param=param) from None


def structured_of(req: CompletionRequest | ChatCompletionRequest) -> Any:
    """``SamplingParams.structured`` from ``response_format`` / ``structured_outputs`` (400 if both)."""
    fmt, ext = req.response_format, req.structured_outputs
    if ext is not None:
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            raise APIError(400, "response_format and structured_outputs both constrain the output; send one",
                           param="structured_outputs")
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
                        '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} or {"type": "text"}',
                   param="response_format")
