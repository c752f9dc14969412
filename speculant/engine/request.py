"""A request's state inside the engine and what the engine returns for it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from speculant.config.sampling_params import SamplingParams
from speculant.engine.detokenizer import Detokenizer
from speculant.interfaces.batch import RequestView

if TYPE_CHECKING:
    from speculant.engine.grammar.request_grammar import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # holds no KV blocks (new, or preempted)
    RUNNING = "running"  # holds KV blocks; prefilling or decoding
    FINISHED = "finished"


@dataclass
class SpecStats:
    """Speculation counters for one request (or, summed, for the engine)."""

    num_steps: int = 0  # verify steps in which this request speculated
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0  # accepted + bonus/recovered, before stop truncation
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_histogram: list[int] = field(default_factory=list)  # [a]: verify steps that accepted a proposals
    num_off_steps: int = 0  # decode steps without proposals (k = 0: policy, setting, budget or proposer)
    num_unoffered_steps: int = 0  # of those, steps that asked the proposer (k > 0) and got none
    propose_s: float = 0.0  # this request's share of the proposer's time

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verify step, bonus token included."""
        return self.num_emitted_tokens / self.num_steps if self.num_steps else 0.0

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.num_steps += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        self.num_emitted_tokens += num_accepted + 1
        self.accepted_histogram.extend([0] * (num_accepted + 1 - len(self.accepted_histogram)))
        self.accepted_histogram[num_accepted] += 1
        for lst in (self.accepted_per_position, self.drafted_per_position):
            lst.extend([0] * (num_draft - len(lst)))
        for i in range(num_draft):
            self.drafted_per_position[i] += 1
            if i < num_accepted:
                self.accepted_per_position[i] += 1

    def merge(self, other: SpecStats) -> None:
        self.num_steps += other.num_steps
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.num_emitted_tokens += other.num_emitted_tokens
        self.num_off_steps += other.num_off_steps
        self.num_unoffered_steps += other.num_unoffered_steps
        self.propose_s += other.propose_s
        for mine, theirs in ((self.accepted_per_position, other.accepted_per_position),
                             (self.drafted_per_position, other.drafted_per_position),
                             (self.accepted_histogram, other.accepted_histogram)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v

    def as_dict(self) -> dict:
        return {
            "num_steps": self.num_steps,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "mean_draft_length": self.num_draft_tokens / self.num_steps if self.num_steps else 0.0,
            "acceptance_per_position": [
                a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)
            ],
            "accepted_length_histogram": list(self.accepted_histogram),
            "num_off_steps": self.num_off_steps,
            "num_unoffered_steps": self.num_unoffered_steps,
            "propose_s": self.propose_s,
        }


@dataclass(eq=False)  # identity: the scheduler looks requests up in its queues
class Request:
    """One prompt, its sampling settings and everything generated so far.

    ``token_ids`` is prompt + output. ``num_computed_tokens`` counts the
    leading tokens whose K/V are in the cache; a step feeds the tokens after
    them, and a step whose tokens reach the end of ``token_ids`` samples.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # effective seed: params.seed, or one drawn from the engine's seed
    eos_token_ids: frozenset[int] = frozenset()
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None  # why the engine dropped it (finish_reason "error")
    logprobs: list[dict[int, float]] | None = None
    output_text: str = ""
    detokenizer: Detokenizer = field(default_factory=Detokenizer)  # incremental output text
    num_preemptions: int = 0
    spec_stats: SpecStats = field(default_factory=SpecStats)
    block_hashes: list[bytes] = field(default_factory=list)
    """Prefix-cache keys of the leading full blocks of ``token_ids``, computed as
    needed (``engine/prefix_caching.py``); a draft model's pool uses the same keys."""
    grammar: RequestGrammar | None = None
    """Structured output: the matcher following the committed output (``engine/grammar``)."""
    view: RequestView = field(init=False, repr=False)
    """The request as plugins see it (read-only, live; one per request)."""

    def __post_init__(self) -> None:
        self.view = RequestView(self)
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs = []

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def prefill_end(self) -> int:
        """Where (re)prefill stops: every token of a new request (its terminal
        chunk samples the first output token), but all except the last once it
        has output (a preempted request recomputing). That last token is then
        fed as a decode, with proposals, exactly as if the request had never
        been preempted, so its seeded draws see the same step boundaries."""
        return self.num_tokens - 1 if self.num_output_tokens > 0 else self.num_tokens

    @property
    def is_decoding(self) -> bool:
        """Everything but the last sampled token is cached: one token to feed."""
        return self.status is RequestStatus.RUNNING and self.num_uncomputed_tokens == 1 \
            and self.num_output_tokens > 0

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    stop_reason: str | int | None = None
    error: str | None = None
    """With finish_reason "error": what failed, naming the request (the
    engine's other requests are unaffected)."""


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict | None = None
    error: str | None = None
    """Same as ``outputs[0].error``: set when the request failed."""

    @classmethod
    def from_request(cls, req: Request) -> RequestOutput:
        out = CompletionOutput(
            index=0,
            text=req.output_text,
            token_ids=list(req.output_token_ids),
            logprobs=list(req.logprobs) if req.logprobs is not None else None,
            finish_reason=req.finish_reason,
            stop_reason=req.stop_reason,
            error=req.error,
        )
        return cls(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=list(req.prompt_token_ids),
            outputs=[out],
            finished=req.finished,
            metrics={"num_preemptions": req.num_preemptions, **req.spec_stats.as_dict()},
            error=req.error,
        )
