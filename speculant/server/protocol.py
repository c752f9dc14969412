"""Request bodies of the OpenAI-compatible endpoints, as pydantic models.

These models are both the published schema (``/openapi.json``, ``/docs``)
and the validation of every request: a body the schema refuses is refused
(400), a body it allows reaches the engine. Types are strict (``"5"`` is not
a number, ``1`` is not ``true``) and unknown fields are refused, so a
misspelled option is never ignored. Ranges are ``SamplingParams``'s, and a
value out of range is answered with the message the offline API raises
(``explain.py`` borrows it).

OpenAI fields Speculant does not implement are typed to their no-op value
(``n`` and ``best_of`` are 1, ``echo`` false, penalties 0, ``logit_bias``
empty, ``suffix`` empty): anything else is a 400 naming the field and why.

Extensions (vLLM's names, sent with the ``openai`` client's ``extra_body``):
``top_k``, ``min_p``, ``ignore_eos``, ``stop_token_ids``,
``include_stop_str_in_output``, ``structured_outputs`` (exactly one of
``json_schema``, ``json_object``, ``regex``, ``grammar``), ``speculative``
(``SamplingParams.speculative``). ``response_format``
takes OpenAI's ``text``, ``json_object`` and ``json_schema``.

What the schema cannot say is checked when the request runs, and is a 400
with a ``code`` from ``errors.BEYOND_SCHEMA_CODES``: a prompt too long for
the model, token ids outside its vocabulary, a schema, regex or grammar that
does not compile, and fields that contradict each other.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from speculant.config.sampling_params import MAX_LOGPROBS, MAX_TOP_K


def _integral(value: Any) -> Any:
    """JSON Schema's integer includes ``5.0``; Python's int does not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _bool_only(value: Any) -> Any:
    """``0`` equals ``False`` in Python, not in JSON."""
    if not isinstance(value, bool):
        raise ValueError(f"must be a boolean, got {type(value).__name__}")
    return value


# integer types: the range before the validator, or pydantic writes it as "ge"/"le", which JSON Schema ignores
_Integral = BeforeValidator(_integral)
TokenId = Annotated[int, Field(ge=0), _Integral]
Count = Annotated[int, Field(ge=0), _Integral]
PositiveInt = Annotated[int, Field(ge=1), _Integral]
OnlyOne = Annotated[int, Field(ge=1, le=1), _Integral]
TopK = Annotated[int, Field(ge=-1, le=MAX_TOP_K), _Integral]
MAX_JSON_SEED = 2**53 - 1
"""Seeds over HTTP stop at the largest integer JSON holds exactly (RFC 7493, I-JSON): tools that parse numbers
as doubles (schema checkers, fuzzers, JavaScript clients) round larger ones. The offline API takes up to 2**63 - 1."""
Seed = Annotated[int, Field(ge=0, le=MAX_JSON_SEED), _Integral]
NumLogprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS), _Integral]
NoEcho = Annotated[Literal[False], BeforeValidator(_bool_only)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[str, Field(pattern=r"\S")]
"""Text with at least one character that is not white space."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


class StreamOptions(Strict):
    include_usage: bool = False
    """Send one last chunk with ``usage`` (and no choices) before ``[DONE]``."""


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, use_attribute_docstrings=True)

    name: str
    schema_: dict[str, Any] | str = Field(alias="schema")
    """The JSON schema the output must match (an object, or its JSON text)."""
    strict: bool | None = None
    description: str | None = None


class JsonSchemaFormat(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class JsonSchemaOutput(Strict):
    json_schema: dict[str, Any] | str


class JsonObjectOutput(Strict):
    json_object: Literal[True]


class RegexOutput(Strict):
    regex: Text


class GrammarOutput(Strict):
    grammar: Text
    """A Lark grammar."""


StructuredOutputs = JsonSchemaOutput | JsonObjectOutput | RegexOutput | GrammarOutput


class SpeculativeOptions(Strict):
    """This request's speculation, within what the engine's ``[speculative]`` config allows."""

    enabled: bool = True
    """false: this request never speculates (its proposer does no work for it)."""
    num_speculative_tokens: Count | None = None
    """At most this many proposals per step (at most the engine's k; 0 turns speculation off)."""
    adaptive: bool = True
    """false: always num_speculative_tokens (or the engine's k), whatever the draft-length policy chooses."""


class _Common(Strict):
    model: str | None = None
    """The served model name (``GET /v1/models``); omitted means that model."""
    stream: bool = False
    """Answer as server-sent events (``text/event-stream``), one chunk per engine step, then ``[DONE]``."""
    stream_options: StreamOptions | None = None
    n: OnlyOne = 1
    """Choices per request: only 1 (send the request again with another seed for more)."""
    max_tokens: PositiveInt | None = None
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    """0 is greedy decoding."""
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: TopK | None = None
    """Extension: keep the k most likely tokens; 0 or -1 disables it."""
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    """Extension: drop tokens less likely than min_p times the most likely one."""
    seed: Seed | None = None
    stop: NonEmptyStr | list[NonEmptyStr] | None = None
    stop_token_ids: list[TokenId] | None = None
    """Extension: token ids that end the output."""
    ignore_eos: bool | None = None
    """Extension: keep generating past the end-of-sequence token."""
    include_stop_str_in_output: bool | None = None
    """Extension: keep the matched stop string at the end of the text."""
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    """Extension: constrain the output to a JSON schema, any JSON object, a regex or a Lark grammar."""
    speculative: SpeculativeOptions | None = None
    """Extension: this request's speculation within the engine's: ``{"enabled": false}``,
    ``{"num_speculative_tokens": n}`` (n at most the engine's), ``{"adaptive": false}``."""
    presence_penalty: float = Field(0.0, ge=0, le=0)
    """Not implemented: only 0."""
    frequency_penalty: float = Field(0.0, ge=0, le=0)
    """Not implemented: only 0."""
    logit_bias: dict[str, float] | None = Field(None, max_length=0)
    """Not implemented: only empty."""
    user: str | None = None
    """Accepted and ignored (OpenAI uses it for abuse monitoring)."""


Prompt = (NonEmptyStr | TokenIds | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=1)]
          | Annotated[list[TokenIds], Field(min_length=1, max_length=1)])


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: Prompt
    """A string, a list of token ids, or a list holding one of those."""
    logprobs: NumLogprobs | None = None
    """How many top log-probabilities to return per token; null for none."""
    echo: NoEcho = False
    """Not implemented: only false."""
    best_of: OnlyOne | None = None
    """Not implemented: only 1."""
    suffix: str | None = Field(None, max_length=0)
    """Not implemented: only empty."""


class TextPart(Strict):
    type: Literal["text"]
    text: str


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart]
    name: str | None = None


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: PositiveInt | None = None
    """OpenAI's newer name for ``max_tokens``; if both are sent they must be equal."""
    logprobs: bool = False
    top_logprobs: NumLogprobs | None = None
    """With ``logprobs=true``: how many alternatives per token."""
