"""Per-request sampling settings, validated on construction.

Every field is checked for its type as well as its range: a ``bool`` is not
accepted where an integer is meant (``max_tokens=True`` is a mistake, not 1),
floats must be real and finite, and strings must be encodable as UTF-8. A
wrong type raises ``TypeError``, a value out of range ``ValueError``; both
name the option, the value, the reason and the fix.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass, field
from typing import SupportsIndex

from speculant.interfaces.speculative_params import SpeculativeParams, parse_speculative
from speculant.interfaces.structured import StructuredOutput, parse_structured

MIN_TEMPERATURE = 1e-5
"""Temperatures in ``(0, MIN_TEMPERATURE)`` are treated as greedy (stored as
0.0). Dividing float32 logits by anything smaller risks overflowing to inf
(1e-45 turns every logit into +-inf and the distribution into NaN); at 1e-5
the scaled logits stay finite for any |logit| < 3e33, and a distribution that
sharp is already the argmax."""

MAX_LOGPROBS = 20
"""Most top log-probabilities a request may ask for per token (vLLM's default
``max_logprobs``)."""

MAX_TOP_K = 2**31 - 1
"""Largest ``top_k``; a value at least the vocabulary size means no top-k filtering."""

MAX_SEED = 2**63 - 1
"""Seeds are integers in ``[0, MAX_SEED]`` (what ``torch.Generator.manual_seed`` takes)."""


@dataclass
class SamplingParams:
    """How to sample one request's continuation.

    ``temperature = 0`` is greedy decoding, and so is any temperature below
    ``MIN_TEMPERATURE`` (1e-5; it is stored as 0.0). ``top_k = 0`` or ``-1``
    disables top-k (a ``top_k`` above the vocabulary size filters nothing);
    ``top_p = 1`` and ``min_p = 0`` disable their filters. A ``seed`` (an
    integer in ``[0, 2**63 - 1]``) makes the request's random draws
    independent of whatever else is batched with it. ``logprobs`` asks for up
    to ``MAX_LOGPROBS`` (20) top log-probabilities per token. ``stop`` is a
    string or a list of non-empty strings; ``stop_token_ids`` are ids >= 0.
    ``structured`` constrains the output to a JSON schema, any JSON object, a
    regex or a Lark grammar (``config/structured.py``); it is stored as a
    ``StructuredOutput``, and an EOS the grammar allows ends the request even
    with ``ignore_eos``. ``speculative`` narrows the engine's speculation for
    this request (``interfaces/speculative_params.py``): ``{"enabled": False}``,
    ``{"num_speculative_tokens": n}``, ``{"adaptive": False}``; stored as a
    ``SpeculativeParams``.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    structured: StructuredOutput | dict | None = None
    speculative: SpeculativeParams | dict | None = None

    def __post_init__(self) -> None:
        self.max_tokens = _int("max_tokens", self.max_tokens, "ask for at least one token, e.g. max_tokens=16")
        _check(self.max_tokens >= 1, "max_tokens", self.max_tokens, "must be an integer >= 1",
               "ask for at least one token")
        self.temperature = _real("temperature", self.temperature, "use 0 for greedy decoding or a positive value")
        _check(self.temperature >= 0, "temperature", self.temperature,
               "must be >= 0", "use 0 for greedy decoding or a positive value to sample")
        if self.temperature < MIN_TEMPERATURE:
            self.temperature = 0.0  # greedy; see MIN_TEMPERATURE
        self.top_k = _int("top_k", self.top_k, "use 0 or -1 to disable top-k")
        _check(-1 <= self.top_k <= MAX_TOP_K, "top_k", self.top_k, f"must be an integer in [-1, {MAX_TOP_K}]",
               "use 0 or -1 to disable top-k (a value above the vocabulary size also filters nothing)")
        self.top_p = _real("top_p", self.top_p, "use 1.0 to disable nucleus sampling")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]", "use 1.0 to disable nucleus sampling")
        self.min_p = _real("min_p", self.min_p, "use 0.0 to disable min-p filtering")
        _check(0 <= self.min_p <= 1, "min_p", self.min_p, "must be in [0, 1]", "use 0.0 to disable min-p filtering")
        if self.seed is not None:
            self.seed = _int("seed", self.seed, f"pass an integer in [0, {MAX_SEED}] or None")
            _check(0 <= self.seed <= MAX_SEED, "seed", self.seed, f"must be in [0, 2**63 - 1] = [0, {MAX_SEED}]",
                   "pass a non-negative seed below 2**63, or None for a random one")
        if self.logprobs is not None:
            self.logprobs = _int("logprobs", self.logprobs, f"pass an integer in [0, {MAX_LOGPROBS}] or None")
            _check(0 <= self.logprobs <= MAX_LOGPROBS, "logprobs", self.logprobs,
                   f"must be None or an integer in [0, {MAX_LOGPROBS}]",
                   f"ask for at most {MAX_LOGPROBS} top log-probabilities per token")
        self.stop = _stop_strings(self.stop)
        self.stop_token_ids = _token_ids(self.stop_token_ids)
        self.structured = parse_structured(self.structured)
        self.speculative = parse_speculative(self.speculative)
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"SamplingParams.{name}={getattr(self, name)!r} must be a bool, got "
                                f"{type(getattr(self, name)).__name__}; pass True or False.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def speculation(self) -> SpeculativeParams:
        """``speculative`` as validated (a dict given is parsed on construction)."""
        s = self.speculative
        return s if isinstance(s, SpeculativeParams) else parse_speculative(s)

    @property
    def constraint(self) -> StructuredOutput | None:
        """``structured`` as validated (a dict given is parsed on construction)."""
        s = self.structured
        return s if isinstance(s, StructuredOutput) else parse_structured(s)


def _check(ok: bool, option: str, value: object, reason: str, fix: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{option}={value!r} {reason}; {fix}.")


def _type_error(option: str, value: object, wanted: str, fix: str) -> TypeError:
    return TypeError(f"SamplingParams.{option}={value!r} must be {wanted}, got {type(value).__name__}; {fix}.")


def _int(option: str, value: object, fix: str) -> int:
    """``value`` as a Python int: ints and integer-like objects (numpy ints), not bools or floats."""
    if isinstance(value, bool):
        raise _type_error(option, value, "an integer (a bool is not accepted as a number)", fix)
    if not isinstance(value, SupportsIndex):
        raise _type_error(option, value, "an integer", fix)
    try:
        return operator.index(value)
    except TypeError:  # an __index__ that refuses
        raise _type_error(option, value, "an integer", fix) from None


def _real(option: str, value: object, fix: str) -> float:
    """``value`` as a finite float: ints and real numbers, not bools, NaN or infinities."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _type_error(option, value, "a real number", fix)
    out = float(value)
    _check(math.isfinite(out), option, value, "must be a finite number (not NaN or infinity)", fix)
    return out


def _encodable(option: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"SamplingParams.{option} contains {text!r}, which cannot be encoded as UTF-8 "
                         f"({exc.reason} at index {exc.start}); remove the lone surrogate characters.") from None


def _stop_strings(stop: object) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        raise _type_error("stop", stop, "a str or a list of str", "pass stop='text' or stop=['a', 'b']")
    for s in stop:
        if not isinstance(s, str):
            raise _type_error("stop", list(stop), "a list of str (found a non-string item)",
                              f"pass every stop string as str (got {type(s).__name__} {s!r})")
        _check(bool(s), "stop", list(stop), "must be non-empty strings", "remove empty stop strings")
        _encodable("stop", s)
    return list(stop)


def _token_ids(ids: object) -> list[int]:
    if ids is None:
        return []
    if not isinstance(ids, (list, tuple)):
        raise _type_error("stop_token_ids", ids, "a list of int token ids", "pass e.g. stop_token_ids=[2]")
    out = [_int("stop_token_ids", t, "pass int token ids, e.g. stop_token_ids=[2]") for t in ids]
    _check(all(t >= 0 for t in out), "stop_token_ids", out, "must be token ids >= 0", "remove negative ids")
    return out
