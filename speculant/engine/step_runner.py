"""Run one scheduled step as a transaction: compute everything, then commit.

Nothing here changes a request. ``run_step`` proposes (a faulty proposer only
costs speculation, see ``proposer_guard``), scores and decides for the whole
batch, and plans each request's new state (``commit.plan``); the engine then
applies the plans, which cannot fail. When scoring or deciding raises:

1. if the batch speculated, the step is retried once without proposals (the
   proposer then commits "nothing accepted", which it handles anyway);
2. if that fails too, or nothing speculated, every entry is computed alone,
   without speculation: an entry that still fails is blamed for the fault and
   its request fails (finish_reason "error", with the request id and cause);
   the others advance normally. The proposer's state for the whole step is
   reset rather than committed (its cache may hold half-written steps).

A request whose commit planning raises fails alone the same way, and so does
a request whose grammar fails (structured output, ``engine/grammar``). Grammar
masks are applied to the logits before every decision, retries included.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.commit import Outcome, Plan, outcomes_of, plan
from speculant.engine.detokenizer import TextDecoder
from speculant.engine.grammar.step_masks import StepGrammar, StructuredOutputs
from speculant.engine.proposer_guard import ProposerGuard
from speculant.engine.runner_view import SequenceRunner
from speculant.engine.step import StepTimes, Timer, decide, propose, score
from speculant.engine.tree_shape import AdaptiveTreeShapes
from speculant.engine.trees import compact_paths
from speculant.interfaces import AcceptanceMethod, Proposals, Proposer, Scorer, Scores

logger = logging.getLogger(__name__)


@dataclass
class StepParts:
    """What a step runs with (the engine's current components)."""

    runner: SequenceRunner  # the target as plugins see it: its forward, its blocks
    proposer: Proposer | None
    scorer: Scorer | None
    acceptance: AcceptanceMethod | None
    guard: ProposerGuard
    want_hidden: bool
    decoder: TextDecoder
    track_text: bool = False  # keep unfinished requests' text up to date (streaming)
    structured: StructuredOutputs | None = None  # grammar masks (None: no request may have one)
    trees: AdaptiveTreeShapes | None = None  # plans each decode's tree shape (None: trees as proposed)


@dataclass
class StepRun:
    plans: list[Plan]  # requests that advance (batch order)
    errors: dict[int, str]  # index into batch.entries -> why that request failed
    scores: Scores | None  # set when the proposer may commit with num_accepted
    num_accepted: list[int]  # per decode
    times: StepTimes = field(default_factory=StepTimes)
    fallback: str = ""  # "", "no_speculation" or "isolated": how the step was computed
    accepted_nodes: list[list[int]] | None = None  # per decode, for token trees: the accepted path


def failure(entry: ScheduledRequest, stage: str, exc: BaseException) -> str:
    return (f"request {entry.request.request_id!r} failed while {stage}: {type(exc).__name__}: {exc}; "
            "the engine dropped this request and keeps serving its other requests")


def run_step(batch: StepBatch, parts: StepParts) -> StepRun:
    timer, times = Timer(), StepTimes()
    proposals = propose(parts.proposer, batch, parts.guard, parts.runner.device)
    if parts.trees is not None:
        proposals = parts.trees.prune(batch, proposals)
    # grammar: sync, cut proposals it forbids, start the masks (overlapped with the forward)
    grammar = parts.structured.begin(batch, proposals) if parts.structured is not None else None
    if grammar is not None:
        proposals = grammar.proposals
    if parts.trees is not None:
        parts.trees.verified(batch, proposals)
    times.propose_s = timer.lap()
    try:
        return _compute(batch, proposals, parts, timer, times, grammar)
    finally:
        if grammar is not None:
            grammar.wait()  # the worker never outlives its step: the next one syncs the same matchers


def _masked(grammar: StepGrammar | None, batch: StepBatch, proposals: Proposals, scores: Scores) -> Scores:
    return scores if grammar is None else grammar.apply(batch, proposals, scores)


def _grammar_faults(batch: StepBatch, grammar: StepGrammar | None,
                    outcomes: Sequence[Outcome | None]) -> tuple[list[Outcome | None], dict[int, str]]:
    """Outcomes without those of requests whose grammar failed, and their errors."""
    out, errors = list(outcomes), {}
    if grammar is not None and grammar.faults:
        for idx, entry in enumerate(batch.entries):
            reason = grammar.faults.get(entry.request.request_id)
            if reason is not None:
                out[idx] = None
                errors[idx] = (f"request {entry.request.request_id!r} failed: {reason}; the engine dropped "
                               "this request and keeps serving its other requests")
                logger.warning("%s", errors[idx])
    return out, errors


def _compute(batch: StepBatch, proposals: Proposals, parts: StepParts, timer: Timer,
             times: StepTimes, grammar: StepGrammar | None = None) -> StepRun:
    try:
        scores = score(parts.scorer, parts.runner, batch, proposals, parts.want_hidden)
        times.score_s = timer.lap()
        decisions = decide(parts.acceptance, batch, proposals, _masked(grammar, batch, proposals, scores))
        if decisions.accepted_nodes is not None:  # a token tree: its accepted path's K/V into place
            compact_paths(parts.runner, batch.decodes, decisions.accepted_nodes)
        times.accept_s = timer.lap()
        outcomes, errors = _grammar_faults(batch, grammar, outcomes_of(batch, decisions))
        run = _planned(batch, outcomes, errors, scores, parts, times, "")
        run.accepted_nodes = decisions.accepted_nodes
        return run
    except Exception as exc:  # noqa: BLE001 - any fault: retry, then isolate
        first = exc
    if proposals.num_draft_tokens > 0:
        logger.warning("step of %d requests failed with speculation (%s: %s); retrying it without",
                       len(batch.entries), type(first).__name__, first,
                       exc_info=(type(first), first, first.__traceback__))
        empty = Proposals.empty(len(batch.decodes), parts.runner.device)
        try:
            scores = score(parts.scorer, parts.runner, batch, empty, parts.want_hidden)
            decisions = decide(parts.acceptance, batch, empty, _masked(grammar, batch, empty, scores))
            times.score_s = timer.lap()
            outcomes, errors = _grammar_faults(batch, grammar, outcomes_of(batch, decisions))
            return _planned(batch, outcomes, errors, scores, parts, times, "no_speculation")
        except Exception as exc:  # noqa: BLE001
            first = exc
    logger.warning("step of %d requests failed (%s: %s); computing each request alone to find the "
                   "one(s) at fault", len(batch.entries), type(first).__name__, first,
                   exc_info=(type(first), first, first.__traceback__))
    outcomes, errors = _isolated(batch, parts, grammar)
    times.score_s = timer.lap()
    outcomes, grammar_errors = _grammar_faults(batch, grammar, outcomes)
    return _planned(batch, outcomes, {**grammar_errors, **errors}, None, parts, times, "isolated")


def _isolated(batch: StepBatch, parts: StepParts,
              grammar: StepGrammar | None = None) -> tuple[list[Outcome | None], dict[int, str]]:
    outcomes: list[Outcome | None] = []
    errors: dict[int, str] = {}
    num_prefills = len(batch.prefills)
    for idx, entry in enumerate(batch.entries):
        sub = StepBatch(prefills=[entry]) if idx < num_prefills else StepBatch(decodes=[entry])
        empty = Proposals.empty(len(sub.decodes), parts.runner.device)
        stage = f"computing its step alone in {_plugin('scorer', parts.scorer)}"
        try:
            scores = score(parts.scorer, parts.runner, sub, empty, parts.want_hidden)
            stage = "sampling its token alone"  # no proposals: the acceptance method is not called
            scores = _masked(grammar, sub, empty, scores)
            outcomes.append(outcomes_of(sub, decide(parts.acceptance, sub, empty, scores))[0])
        except Exception as exc:
            outcomes.append(None)
            errors[idx] = failure(entry, stage, exc)
            logger.warning("%s", errors[idx], exc_info=(type(exc), exc, exc.__traceback__))
    return outcomes, errors


def _plugin(kind: str, component: object | None) -> str:
    """Where a stage ran, for error messages: the plugin by kind and name."""
    if component is None:
        return "the built-in forward (no scorer configured)"
    return f"{kind} plugin {getattr(component, 'name', type(component).__name__)!r}"


def _planned(batch: StepBatch, outcomes: Sequence[Outcome | None], errors: dict[int, str], scores: Scores | None,
             parts: StepParts, times: StepTimes, fallback: str) -> StepRun:
    plans = []
    max_len = parts.runner.max_model_len
    for idx, (entry, outcome) in enumerate(zip(batch.entries, outcomes)):
        if outcome is None:
            continue
        try:
            plans.append(plan(entry, outcome, max_len, parts.decoder, parts.track_text))
        except Exception as exc:
            errors[idx] = failure(entry, "committing its tokens", exc)
            logger.warning("%s", errors[idx], exc_info=(type(exc), exc, exc.__traceback__))
    decode_outcomes = outcomes[len(batch.prefills):]
    num_accepted = [o.num_accepted if o is not None else 0 for o in decode_outcomes]
    return StepRun(plans, errors, scores, num_accepted, times, fallback)
