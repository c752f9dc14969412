"""Per-request sampling settings, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How to sample one request's continuation.

    ``temperature = 0`` is greedy decoding. ``top_k = 0`` or ``-1`` disables
    top-k; ``top_p = 1`` and ``min_p = 0`` disable their filters. A ``seed``
    makes the request's random draws independent of whatever else is batched
    with it.
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

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens",
               self.max_tokens, "must be an integer >= 1", "ask for at least one token")
        _check(self.temperature >= 0, "temperature", self.temperature,
               "must be >= 0", "use 0 for greedy decoding or a positive value to sample")
        _check(isinstance(self.top_k, int) and self.top_k >= -1, "top_k", self.top_k,
               "must be an integer >= -1", "use 0 or -1 to disable top-k")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]",
               "use 1.0 to disable nucleus sampling")
        _check(0 <= self.min_p <= 1, "min_p", self.min_p, "must be in [0, 1]",
               "use 0.0 to disable min-p filtering")
        _check(self.logprobs is None or (isinstance(self.logprobs, int) and self.logprobs >= 0),
               "logprobs", self.logprobs, "must be None or an integer >= 0",
               "pass the number of top log-probabilities wanted per token")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop,
               "must be non-empty strings", "remove empty stop strings")
        _check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               self.stop_token_ids, "must be token ids >= 0", "remove negative ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check(ok: bool, option: str, value: object, reason: str, fix: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{option}={value!r} {reason}; {fix}.")
