"""Commit a step in two phases: plan every request's new state, then apply.

Planning runs everything that can fail (stop rules, detokenizing for stop
strings and streaming, top-N log-probs) on a copy of each request; a request
whose planning raises is reported failed and left untouched. The copy shares the
request's ``Detokenizer``, which is immutable: planning replaces the copy's.
Applying only assigns the planned fields, so it cannot fail halfway: after a
step either a request advanced by exactly what was decided for it, or not at all.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.detokenizer import TextDecoder
from speculant.engine.request import Request
from speculant.engine.stop_rules import append_tokens, catch_up
from speculant.sampling.sampler import top_logprobs


@dataclass
class Outcome:
    """What one scheduled entry emits this step (before stop rules)."""

    tokens: list[int] = field(default_factory=list)  # [] for a chunk that does not sample
    logprobs: list[torch.Tensor | None] = field(default_factory=list)  # per token: [V] or None
    num_accepted: int = 0
    num_drafted: int = 0


def outcomes_of(batch: StepBatch, decisions) -> list[Outcome]:
    """``step.Decisions`` as one ``Outcome`` per entry of ``batch.entries``."""
    out = []
    sampling = iter(zip(decisions.prefill_tokens, decisions.prefill_logprobs))
    for p in batch.prefills:
        if p.samples:
            tokens, lps = next(sampling)
            out.append(Outcome(list(tokens), list(lps)))
        else:
            out.append(Outcome())
    drafted = decisions.num_drafted or [0] * len(batch.decodes)
    for tokens, lps, a, k in zip(decisions.decode_tokens, decisions.decode_logprobs,
                                 decisions.num_accepted, drafted):
        out.append(Outcome(list(tokens), list(lps), a, k))
    assert len(out) == len(batch.entries), "decisions do not cover every entry of the batch"
    return out


@dataclass
class Plan:
    entry: ScheduledRequest
    outcome: Outcome
    new: Request  # a copy of entry.request holding its state after this step


def plan(entry: ScheduledRequest, outcome: Outcome, max_model_len: int, decoder: TextDecoder,
         track_text: bool = False) -> Plan:
    """``entry``'s request after this step, on a copy. With ``track_text`` its
    incremental text is brought up to date (streaming), stop strings or not."""
    req = entry.request
    new = copy.copy(req)
    new.token_ids = list(req.token_ids)
    new.logprobs = list(req.logprobs) if req.logprobs is not None else None
    new.num_computed_tokens = req.num_computed_tokens + entry.num_new_tokens + outcome.num_accepted
    if outcome.tokens:
        n = req.params.logprobs
        entries = [top_logprobs(_row(lp), tok, n) for tok, lp in zip(outcome.tokens, outcome.logprobs)] \
            if n is not None else None
        append_tokens(new, outcome.tokens, max_model_len, decoder, entries)
    if track_text and not new.finished:
        catch_up(new, decoder)
    return Plan(entry, outcome, new)


def _row(lp: torch.Tensor | None) -> torch.Tensor:
    """A token's [V] log-probs; present for every token of a request that asks for log-probabilities."""
    assert lp is not None, "a request asking for log-probabilities got a token without them"
    return lp


def apply(p: Plan) -> None:
    """Make the planned state the request's own (plain assignments)."""
    req, new = p.entry.request, p.new
    req.token_ids = new.token_ids
    req.logprobs = new.logprobs
    req.num_computed_tokens = new.num_computed_tokens
    req.status = new.status
    req.finish_reason = new.finish_reason
    req.stop_reason = new.stop_reason
    req.output_text = new.output_text
    req.detokenizer = new.detokenizer
    if p.outcome.num_drafted:
        req.spec_stats.record(p.outcome.num_drafted, p.outcome.num_accepted)
