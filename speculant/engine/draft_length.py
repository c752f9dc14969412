"""Draft-length policies: how many proposals each running decode may get in a step.

The engine asks its policy once per step, before scheduling (``plan``); the
scheduler then trims each request's k to the token budget and to the
request's room (``max_model_len``, ``max_tokens``). Greedy output does not
depend on k (every proposal is verified), so a policy only changes speed.

- ``fixed``: every decode may get ``num_speculative_tokens`` (with token trees,
  ``speculative.tree_width`` > 1: ``max_tree_tokens`` nodes).
- ``adaptive``: the rule below (with token trees, ``tree_shape.AdaptiveTreeShapes``
  applies the same rule to tree nodes, each priced by its depth's and branch's acceptance).

The adaptive rule. Each request keeps a per-position acceptance estimate
(``acceptance_estimate.py``): for each position j, P(accept j | reached j),
from decayed counts of the verify steps that reached j (``acceptance_decay``
per observation, starting from ``prior_acceptance`` worth two). The j-th
proposal's expected gain in tokens is the product of the rates up to j: a
request whose drafts are kept all or nothing (a copied span) keeps long drafts
worth their length, where one geometric rate ``a ** j`` would shorten them.
A proposer with its own confidence (``suffix``'s ``min_token_prob``,
``draft_model``'s ``confidence_threshold``) stops drafting early by itself;
the policy only sets the ceiling, and rejected tokens drafted below it are what
lower the estimate.

The batch's cost is priced by a ``CostModel`` (``cost_model.py``): a target
forward over T tokens costs ``t(T)/t(1)`` (the measured curve; a configured
``token_cost`` c makes it ``(1 - c) + c * T``), plus ``d = draft_token_cost``
per proposal. Without speculation n decodes yield n tokens at cost ``t(n)/t(1)``.
A request's gains and its drafts' rows are scaled by its offer
rate (the chance its proposer offers anything when asked), and asking it
costs ``a = ask_cost`` (what an ask that gets nothing costs, learnt from the
step timings). Proposals are taken in order of decreasing gain (so each request's first
positions before its later ones), and the step keeps the longest prefix of that
order that maximises the step's expected tokens per unit of cost, (n + sum of
gains) / cost: for a lone decode, the k that maximises (1 + G_1 + ... + G_k) /
(t(k + 1)/t(1) + k d). A draft that does not pay by itself is still taken when
the ones after it make the whole worth more (a flat stretch of the curve, or a
run of nearly sure positions behind a doubtful first one). So a lone decode
(cost dominated by the fixed part) drafts whenever its gains are not tiny, and
as decodes grow the forward's fixed part is shared by more tokens and the bar
rises towards 1: the step's total drafts shrink with the batch, to none when no
prefix of proposals is expected to pay. Under the model, a step with
speculation is never expected to be slower per token than without. A step in
which a request was not asked for proposals moves its estimate back toward the
prior by ``acceptance_decay``, so a request held at k = 0 is tried again once
the prior would pay (small batches), and stays at 0 where even the prior would
not (large ones). A step that asked and got nothing (no n-gram match, no
confident suffix) is neither a rejection nor a step off: it lowers the
request's offer rate, which scales its gains, so a proposer that keeps having
nothing is asked less (``acceptance_estimate``).

Per request (``SamplingParams.speculative``), a request may lower its own
ceiling, turn speculation off (0 always) or opt out of the policy
(``adaptive = false``: its ceiling every step). Those fixed drafts are priced
into the batch before the policy allocates the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from speculant.config.models import AdaptiveDraftLengthConfig, SpeculativeConfig
from speculant.engine.acceptance_estimate import PositionAcceptance
from speculant.engine.cost_model import CostCurve, CostModel
from speculant.engine.request import Request


class DraftLengthPolicy(ABC):
    """Decides each step's per-request proposal ceilings (``plan``) and counts what it decided."""

    name: ClassVar[str]

    def __init__(self, spec: SpeculativeConfig) -> None:
        # with token trees a decode's ceiling counts tree nodes (the checker admits trees only
        # with a proposer that proposes them)
        self.max_k = spec.max_tree_tokens if spec.trees else spec.num_speculative_tokens
        self.disable_by_batch_size = spec.disable_by_batch_size
        self.reset_metrics()

    def reset_metrics(self) -> None:
        self.num_planned_decodes = 0  # decodes planned (summed over steps)
        self.num_planned_tokens = 0  # their ceilings, summed
        self.num_planned_zero = 0  # decodes planned at k = 0

    def plan(self, running: Sequence[Request]) -> dict[str, int]:
        """request id -> most proposals it may get this step, for each decoding
        request in ``running`` (the scheduler's running list, arrival order).
        Above ``disable_by_batch_size`` running requests nobody speculates."""
        decoding = [r for r in running if r.is_decoding]
        if self.disable_by_batch_size is not None and len(running) > self.disable_by_batch_size:
            lengths = {r.request_id: 0 for r in decoding}
        else:
            ceilings = {r.request_id: r.params.speculation.max_tokens(self.max_k) for r in decoding}
            fixed = {r.request_id: ceilings[r.request_id] for r in decoding
                     if not r.params.speculation.adaptive or ceilings[r.request_id] == 0}
            free = [r for r in decoding if r.request_id not in fixed]
            held = [r for r in decoding if r.request_id in fixed and fixed[r.request_id] > 0]
            lengths = {**self.lengths(free, ceilings, fixed, held), **fixed}
        self.num_planned_decodes += len(lengths)
        self.num_planned_tokens += sum(lengths.values())
        self.num_planned_zero += sum(1 for k in lengths.values() if k == 0)
        return lengths

    @abstractmethod
    def lengths(self, decoding: list[Request], ceilings: dict[str, int], fixed: dict[str, int],
                fixed_requests: Sequence[Request] = ()) -> dict[str, int]:
        """The ceilings for ``decoding`` (all of them decoding this step, each
        allowed at most ``ceilings[id]``), beside the requests of ``fixed`` that
        draft their own fixed number this step (``fixed_requests``: those of
        them that draft at all)."""

    def free(self, request_id: str) -> None:  # noqa: B027 - optional: stateless policies keep nothing
        """Forget a finished request."""

    def metrics(self) -> dict:
        n = self.num_planned_decodes
        return {
            "draft_length_policy": self.name,
            "mean_planned_draft_length": self.num_planned_tokens / n if n else 0.0,
            "planned_zero_fraction": self.num_planned_zero / n if n else 0.0,
        }


class FixedDraftLength(DraftLengthPolicy):
    """Every decode may get ``num_speculative_tokens`` proposals."""

    name = "fixed"

    def lengths(self, decoding: list[Request], ceilings: dict[str, int], fixed: dict[str, int],
                fixed_requests: Sequence[Request] = ()) -> dict[str, int]:
        return {r.request_id: ceilings[r.request_id] for r in decoding}


@dataclass
class _Acceptance:
    """A request's per-position estimate and where its counters stood last step."""

    positions: PositionAcceptance
    drafted: int = 0  # request.spec_stats.num_draft_tokens when last read
    accepted: int = 0
    unoffered: int = 0  # request.spec_stats.num_unoffered_steps when last read


class AdaptiveDraftLength(DraftLengthPolicy):
    """k per request from its observed acceptance; drafts per batch from the cost model (module docstring)."""

    name = "adaptive"

    def __init__(self, spec: SpeculativeConfig, cost: CostModel | None = None) -> None:
        """``cost``: the measured figures (``cost_cache.load_cost_model``); None
        takes the config's ``token_cost`` and ``draft_token_cost`` (0.05 and 0 if unset)."""
        super().__init__(spec)
        assert isinstance(spec.draft_length, AdaptiveDraftLengthConfig)
        self.config = spec.draft_length
        self.cost = cost if cost is not None else CostModel(
            CostCurve.linear(self.config.token_cost if self.config.token_cost is not None else 0.05),
            self.config.draft_token_cost if self.config.draft_token_cost is not None else 0.0)
        self._state: dict[str, _Acceptance] = {}

    def estimate(self, request: Request) -> PositionAcceptance:
        """The request's per-position acceptance, after folding in the verify
        step since the last call (call once per step per request)."""
        cfg = self.config
        state = self._state.get(request.request_id)
        if state is None:
            state = self._state[request.request_id] = _Acceptance(
                PositionAcceptance(cfg.prior_acceptance, cfg.acceptance_decay))
        stats = request.spec_stats
        drafted, accepted = stats.num_draft_tokens - state.drafted, stats.num_accepted_tokens - state.accepted
        if drafted > 0:  # one verify step per engine step, so this is the last step's record
            state.positions.observe(drafted, accepted)
        elif stats.num_unoffered_steps > state.unoffered:  # asked, nothing offered: not a rejection
            state.positions.nothing_offered()
        else:  # not asked: drift back toward the prior
            state.positions.drift()
        state.drafted, state.accepted = stats.num_draft_tokens, stats.num_accepted_tokens
        state.unoffered = stats.num_unoffered_steps
        return state.positions

    def lengths(self, decoding: list[Request], ceilings: dict[str, int], fixed: dict[str, int],
                fixed_requests: Sequence[Request] = ()) -> dict[str, int]:
        estimates = [self.estimate(r) for r in decoding]
        gains = [e.gains(ceilings[r.request_id]) for e, r in zip(estimates, decoding)]
        offers = [e.offer_rate() for e in estimates]
        held = [self.estimate(r).gains(fixed[r.request_id]) for r in fixed_requests]  # each folded in once a step
        if not decoding:
            return {}
        lengths = {r.request_id: 0 for r in decoding}
        curve, d, ask = self.cost.curve, self.cost.draft_token_cost, self.cost.ask_cost
        # the forward's rows before any adaptive draft; an adaptive draft adds a row (and a drafted
        # token) as often as its proposer offers, and a request's first one adds an ask
        tokens = float(len(decoding) + len(fixed) + sum(fixed.values()))
        gain = float(len(decoding) + len(fixed)) + sum(sum(g) for g in held)
        drafts, asks = float(sum(fixed.values())), 0
        candidates = sorted(((g, i) for i, gs in enumerate(gains) for g in gs),
                            key=lambda c: -c[0])  # stable: a request's positions in order, ties to earlier arrivals
        cost = curve.cost(tokens) + d * drafts
        best, best_ratio = 0, gain / cost
        asked = [False] * len(decoding)
        for n, (p, i) in enumerate(candidates, 1):
            if gain + p * (len(candidates) - n + 1) <= best_ratio * cost:
                break  # even if every remaining draft were as good and free, no longer prefix could win
            gain, tokens, drafts = gain + p, tokens + offers[i], drafts + offers[i]
            asks += not asked[i]
            asked[i] = True
            cost = curve.cost(tokens) + d * drafts + ask * asks
            if gain > best_ratio * cost:
                best, best_ratio = n, gain / cost
        for _, i in candidates[:best]:
            lengths[decoding[i].request_id] += 1
        return lengths

    def free(self, request_id: str) -> None:
        self._state.pop(request_id, None)


def build_draft_length_policy(spec: SpeculativeConfig, cost: CostModel | None = None) -> DraftLengthPolicy:
    """The configured policy; ``cost`` prices the adaptive one (see ``AdaptiveDraftLength``)."""
    if spec.draft_length.policy == "adaptive":
        return AdaptiveDraftLength(spec, cost)
    return FixedDraftLength(spec)
