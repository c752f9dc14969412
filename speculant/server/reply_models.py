"""Response bodies, as pydantic models: what ``/openapi.json`` promises and
what ``responses.Reply`` builds (tests check the one against the other).

Completions answer ``Completion`` / ``ChatCompletion`` whole, or a stream of
``CompletionChunk`` / ``ChatCompletionChunk`` events; every error is an
``ErrorResponse``. ``speculant`` is the extension carrying the request's
speculation summary (``speculant.engine.output_record.spec_summary``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    """What was wrong and how to fix it."""
    type: str
    """OpenAI's error class: ``invalid_request_error``, ``not_found_error``, ``rate_limit_error``, ..."""
    param: str | None
    """The request field at fault, if one is."""
    code: str | None
    """A machine-readable cause (``invalid_api_key``, ``queue_full``, ``prompt_too_long``, ...)."""


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpecSummary(BaseModel):
    """How speculation went for this request."""

    spec_steps: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float
    acceptance_per_position: list[float]
    preemptions: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class _Head(BaseModel):
    id: str
    created: int
    model: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    """``stop``, ``length``; null on stream chunks before the last."""


class Completion(_Head):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage
    speculant: SpecSummary


class CompletionChunk(_Head):
    """One ``data:`` event of a streamed ``/v1/completions``; the last one (with
    ``stream_options.include_usage``) has no choices and the usage."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage | None = None
    speculant: SpecSummary | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletion(_Head):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage
    speculant: SpecSummary


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(_Head):
    """One ``data:`` event of a streamed ``/v1/chat/completions``."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speculant: SpecSummary | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]
