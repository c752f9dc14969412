"""Prompt-lookup proposer: guess the continuation by finding the sequence's own
last few tokens earlier in the prompt or output and copying what followed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from speculant.interfaces import Proposals, Proposer, ProposerCapabilities

if TYPE_CHECKING:
    from speculant.interfaces.batch import StepBatch


class NgramOptions(BaseModel):
    """Options of the ``ngram`` proposer."""

    model_config = ConfigDict(extra="forbid")

    min_n: int = Field(default=1, ge=1)
    """Shortest suffix worth matching; a shorter match proposes nothing."""
    max_n: int = Field(default=3, ge=1)
    """Longest suffix tried first; longer matches are preferred."""

    @model_validator(mode="after")
    def _check_range(self) -> NgramOptions:
        if self.min_n > self.max_n:
            raise ValueError(
                f"min_n={self.min_n} is greater than max_n={self.max_n}: the proposer tries suffix "
                f"lengths from max_n down to min_n, so no length would be tried. Set min_n <= max_n "
                f"(e.g. min_n={self.max_n} or max_n={self.min_n})."
            )
        return self


class NgramProposer(Proposer):
    """Propose the tokens that followed the most recent earlier occurrence of the
    sequence's last n tokens, for the largest n in [min_n, max_n] that occurs.

    A decode budgeted ``num_spec_tokens = k`` gets up to k tokens: fewer when the
    match sits near the end of the sequence, none when nothing matches or k is 0.
    Stateless: each step reads ``request.token_ids`` (prompt + output) afresh.
    """

    name = "ngram"
    api_version = "3.0"
    capabilities = ProposerCapabilities(
        needs_target_hidden_states=False,
        supports_chunked_prefill=True,
        draft_probs="one_hot",
        max_num_speculative_tokens=None,
        supports_prefix_caching=True,  # stateless: reads request.token_ids, the whole prompt
    )
    Options: ClassVar[type[BaseModel]] = NgramOptions
    options: NgramOptions

    def propose(self, batch: StepBatch) -> Proposals:
        rows = [
            propose_continuation(d.request.token_ids, d.num_spec_tokens, self.options.min_n, self.options.max_n)
            for d in batch.decodes
        ]
        return Proposals.from_lists(rows, self.context.target.device)


def propose_continuation(tokens: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``num_tokens`` tokens following the best earlier match of the suffix."""
    if num_tokens <= 0:
        return []
    end = find_match_end(tokens, min_n, max_n, num_tokens)
    return [] if end < 0 else list(tokens[end + 1:end + 1 + num_tokens])


def find_match_end(tokens: Sequence[int], min_n: int, max_n: int, want: int = 1) -> int:
    """Index of the last token of the chosen earlier occurrence of the suffix, or -1.

    Walks candidate positions from the most recent backwards (``list.index`` on a
    reversed copy, so the scan runs in C) and measures how far each one matches
    the suffix, up to ``max_n``. The best candidate has the longest match, then
    the most continuation tokens up to ``want``; among equals the most recent
    wins. (Inside a loop of period p the most recent occurrence is followed by
    only p tokens, so preferring it outright would cap proposals at p.)
    """
    num = len(tokens)
    if num < 2:
        return -1
    limit = min(max_n, num - 1)  # the suffix itself cannot be its own earlier occurrence
    before = tokens[-2::-1]  # before[r] is tokens[num - 2 - r]
    last = tokens[-1]
    best, best_end = (0, 0), -1
    r = 0
    while True:
        try:
            r = before.index(last, r)
        except ValueError:
            break
        end = num - 2 - r
        length = 1
        while length < limit and end - length >= 0 and tokens[end - length] == tokens[num - 1 - length]:
            length += 1
        quality = (length, min(num - 1 - end, want))
        if quality > best:
            best, best_end = quality, end
            if quality == (limit, want):
                break
        r += 1
    return best_end if best[0] >= min_n else -1
