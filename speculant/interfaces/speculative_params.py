"""One request's speculation settings: ``SamplingParams.speculative``.

They narrow what the engine's ``[speculative]`` config allows, never widen it:

- ``{"enabled": false}``: this request never speculates (its proposer does no work for it);
- ``{"num_speculative_tokens": n}``: at most n proposals per step, n at most the engine's k;
- ``{"adaptive": false}``: always n (or the engine's k) proposals, whatever the draft-length
  policy would choose; ``true`` (the default) follows the engine's policy.

Whether the engine can honour them (a proposer loaded, n within its k) is
checked when the request is added (``check_against``), so a setting is
refused with a message naming it, never silently ignored.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

FIELDS = ("enabled", "num_speculative_tokens", "adaptive")


@dataclass(frozen=True)
class SpeculativeParams:
    enabled: bool = True
    num_speculative_tokens: int | None = None
    """None: the engine's ``speculative.num_speculative_tokens``."""
    adaptive: bool = True

    def __post_init__(self) -> None:
        for name in ("enabled", "adaptive"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"SamplingParams.speculative.{name}={value!r} must be a bool, got "
                                f"{type(value).__name__}; pass true or false")
        n = self.num_speculative_tokens
        if n is not None:
            if isinstance(n, bool) or not hasattr(n, "__index__"):
                raise TypeError(f"SamplingParams.speculative.num_speculative_tokens={n!r} must be an integer, "
                                f"got {type(n).__name__}; pass e.g. 2 (at most the engine's k)")
            n = operator.index(n)
            if n < 0:
                raise ValueError(f"SamplingParams.speculative.num_speculative_tokens={n} must be >= 0; pass 0 "
                                 "to turn speculation off for this request, or a k up to the engine's")
            object.__setattr__(self, "num_speculative_tokens", n)

    @property
    def is_default(self) -> bool:
        return self == SpeculativeParams()

    def max_tokens(self, engine_k: int) -> int:
        """Most proposals per step for this request under an engine drafting ``engine_k``."""
        if not self.enabled:
            return 0
        return engine_k if self.num_speculative_tokens is None else min(engine_k, self.num_speculative_tokens)

    def check_against(self, proposer: str | None, engine_k: int) -> None:
        """ValueError naming the field when an engine with ``proposer`` (None: no
        speculation) drafting up to ``engine_k`` cannot honour these settings."""
        if self.is_default or self.max_tokens(1) == 0:  # off (or k = 0) asks nothing of the engine
            return
        if proposer is None:
            raise ValueError(
                f"SamplingParams.speculative={self.as_dict()!r} asks for speculation, but this engine runs without "
                "a proposer (speculative.proposer is not set); drop the field or start the engine with a proposer")
        n = self.num_speculative_tokens
        if n is not None and n > engine_k:
            raise ValueError(
                f"SamplingParams.speculative.num_speculative_tokens={n} exceeds the engine's "
                f"speculative.num_speculative_tokens={engine_k} (its buffers and budget are sized for it); "
                f"pass at most {engine_k}, or start the engine with a larger k")

    def as_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "num_speculative_tokens": self.num_speculative_tokens,
                "adaptive": self.adaptive}


def parse_speculative(value: object) -> SpeculativeParams:
    """``SamplingParams.speculative`` from None, a ``SpeculativeParams`` or a dict of ``FIELDS``."""
    if value is None:
        return SpeculativeParams()
    if isinstance(value, SpeculativeParams):
        return value
    if not isinstance(value, dict):
        raise TypeError(f"SamplingParams.speculative={value!r} must be an object such as "
                        f'{{"enabled": false}} or {{"num_speculative_tokens": 2}}, got {type(value).__name__}')
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise ValueError(f"SamplingParams.speculative has unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"allowed keys: {', '.join(FIELDS)}")
    return SpeculativeParams(**value)
