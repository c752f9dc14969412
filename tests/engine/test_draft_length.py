"""Draft-length policies: fixed k, the adaptive rule (per-request acceptance
estimate, per-batch allocation under the cost model), their config errors,
and what the engine reports."""

from __future__ import annotations

import pytest

from speculant.config.compat import parse_config
from speculant.config.models import ConfigError, SpeculativeConfig
from speculant.config.sampling_params import SamplingParams
from speculant.engine.cost_model import CostCurve, CostModel
from speculant.engine.draft_length import AdaptiveDraftLength, FixedDraftLength, build_draft_length_policy
from speculant.engine.request import Request, RequestStatus


def decoding(request_id: str) -> Request:
    req = Request(request_id=request_id, prompt=None, prompt_token_ids=[1, 2], params=SamplingParams(), seed=0)
    req.token_ids = [1, 2, 3]
    req.num_computed_tokens, req.status = 2, RequestStatus.RUNNING
    return req


def spec(k: int = 4, **draft_length) -> SpeculativeConfig:
    dl = {"policy": "adaptive", **draft_length} if draft_length else {"policy": "fixed"}
    return SpeculativeConfig(proposer="ngram", num_speculative_tokens=k, draft_length=dl)


def test_fixed_gives_every_decode_k_and_honours_disable_by_batch_size():
    reqs = [decoding(f"r{i}") for i in range(3)]
    prefilling = Request(request_id="p", prompt=None, prompt_token_ids=[1, 2], params=SamplingParams(), seed=0)
    prefilling.status = RequestStatus.RUNNING
    policy = build_draft_length_policy(spec(3))
    assert isinstance(policy, FixedDraftLength)
    assert policy.plan(reqs + [prefilling]) == {"r0": 3, "r1": 3, "r2": 3}
    off = build_draft_length_policy(SpeculativeConfig(proposer="ngram", num_speculative_tokens=3,
                                                      disable_by_batch_size=3, draft_length={"policy": "fixed"}))
    assert off.plan(reqs) == {"r0": 3, "r1": 3, "r2": 3}
    assert off.plan(reqs + [prefilling]) == {"r0": 0, "r1": 0, "r2": 0}  # 4 running > 3
    assert off.metrics() == {"draft_length_policy": "fixed", "mean_planned_draft_length": 1.5,
                             "planned_zero_fraction": 0.5}


def verify(req: Request, drafted: int, accepted: int) -> None:
    req.spec_stats.record(drafted, accepted)


def test_adaptive_estimate_folds_each_verify_step_in_once():
    policy = AdaptiveDraftLength(spec(4, acceptance_decay=0.5, prior_acceptance=0.5))
    req = decoding("r")
    assert policy.estimate(req).rates(4) == pytest.approx([0.5] * 4)
    verify(req, 4, 1)  # position 1 kept, position 2 rejected, 3 and 4 not reached
    rates = policy.estimate(req).rates(4)
    first = (1 + 1 * 0.5) / (1 + 1)  # the prior's weight 2 decayed to 1
    second = (0 + 1 * first) / (1 + 1)
    assert rates == pytest.approx([first, second, second, second])
    # a step without proposals: counts halve, the prior's weight goes back up to 1.5
    first = (0.5 + 1.5 * 0.5) / (0.5 + 1.5)
    assert policy.estimate(req).rates(2) == pytest.approx([first, (0 + 1.5 * first) / (0.5 + 1.5)])


def test_adaptive_k_falls_with_rejections_and_rises_with_acceptance():
    policy = AdaptiveDraftLength(spec(6, token_cost=0.2))
    req = decoding("r")
    ks = [policy.plan([req])["r"]]
    for _ in range(4):
        verify(req, max(ks[-1], 1), 0)
        ks.append(policy.plan([req])["r"])
    assert ks[-1] < ks[0] and ks == sorted(ks, reverse=True), ks
    for _ in range(6):
        verify(req, max(ks[-1], 1), max(ks[-1], 1))
        ks.append(policy.plan([req])["r"])
    assert ks[-1] == 6, ks


def asks_of_a_proposer_with_nothing(policy: AdaptiveDraftLength, steps: int) -> list[int]:
    """The k planned each step for a request whose proposer never offers anything."""
    req, ks = decoding("r"), []
    for _ in range(steps):
        ks.append(policy.plan([req])["r"])
        req.spec_stats.num_off_steps += 1
        req.spec_stats.num_unoffered_steps += ks[-1] > 0  # asked (k > 0), got nothing
    assert policy.estimate(req).rates(4) == pytest.approx([0.5] * 4)  # no position reached: not a rejection
    return ks


def test_adaptive_asks_a_proposer_that_keeps_offering_nothing_less_and_again_later():
    """n-gram on open chat: an empty ask costs its search (ask_cost, learnt from
    step timings), so the request is held off once its offer rate is low, and
    tried again as steps without an ask restore the offer prior."""
    cost = CostModel(CostCurve((1, 2), (1.0, 1.05), t1_s=0.01))
    cost.observe_step(propose_s=0.0005, accept_s=0.0, num_decodes=1, num_drafted=0, num_asked=1)
    assert cost.ask_cost == pytest.approx(0.05)
    ks = asks_of_a_proposer_with_nothing(AdaptiveDraftLength(spec(4, prior_acceptance=0.5), cost), 100)
    first_off = ks.index(0)
    assert ks[0] > 0 and 4 <= first_off <= 20, ks
    assert 3 <= sum(k > 0 for k in ks[50:]) <= 15, ks  # asked again now and then, in few of the steps
    # asks that cost nothing (a configured cost model): the request stays asked, as before
    free = AdaptiveDraftLength(spec(4, prior_acceptance=0.5, token_cost=0.05, draft_token_cost=0.0))
    assert 0 not in asks_of_a_proposer_with_nothing(free, 100)


def plan_for(n: int, rate: float, token_cost: float, k: int = 4) -> dict[str, int]:
    policy = AdaptiveDraftLength(spec(k, token_cost=token_cost, prior_acceptance=rate))
    return policy.plan([decoding(f"r{i}") for i in range(n)])


def test_adaptive_total_drafts_shrink_as_the_batch_grows():
    totals = [sum(plan_for(n, 0.6, 0.05).values()) / n for n in (1, 2, 4, 8, 16, 32, 64)]
    assert totals[0] == 4 and totals[-1] == 0, totals  # a lone decode drafts all of k; 64 decodes none
    assert totals == sorted(totals, reverse=True), totals
    # likelier proposals survive larger batches
    assert sum(plan_for(32, 0.95, 0.05).values()) > 0
    # free tokens: always k
    assert set(plan_for(32, 0.1, 0.0).values()) == {4}


def test_adaptive_allocation_never_lowers_expected_throughput():
    """Under the cost model, the planned step's expected tokens per unit cost
    is at least the no-speculation step's (n tokens for 1 - c + c n)."""
    for n in (1, 3, 8, 20, 50):
        for rate in (0.1, 0.4, 0.7, 0.9, 0.99):
            for c in (0.01, 0.05, 0.2, 0.6):
                lengths = plan_for(n, rate, c)
                gain = n + sum(sum(rate ** j for j in range(1, k + 1)) for k in lengths.values())
                cost = 1 - c + c * (n + sum(lengths.values()))
                assert gain / cost >= n / (1 - c + c * n) - 1e-12, (n, rate, c, lengths)


def test_adaptive_forgets_finished_requests():
    policy = AdaptiveDraftLength(spec(4, token_cost=0.03))
    policy.plan([decoding("a")])
    policy.free("a")
    assert not policy._state


@pytest.mark.parametrize("draft_length,problem", [
    ({"policy": "adaptve"}, "speculative.draft_length = {'policy': 'adaptve'}: Input tag 'adaptve' found using "
                            "'policy' does not match any of the expected tags: 'fixed', 'adaptive'; write a table "
                            "naming the policy: {policy = \"fixed\"} or {policy = \"adaptive\"}"),
    ("adaptive", "speculative.draft_length = 'adaptive': Input should be a valid dictionary"),
    ({"policy": "adaptive", "token_cost": 1.5}, "speculative.draft_length.token_cost = 1.5: Input should be less "
                                                "than or equal to 1; it is a fraction of a one-token forward's cost"),
    ({"policy": "adaptive", "tokencost": 0.1}, "speculative.draft_length.tokencost: unknown key; allowed keys: "
                                               "acceptance_decay, draft_token_cost, policy, prior_acceptance, "
                                               "token_cost"),
    ({"policy": "fixed", "token_cost": 0.1}, "speculative.draft_length.token_cost: unknown key; allowed keys: policy"),
])
def test_config_errors_name_the_option_and_the_fix(draft_length, problem):
    with pytest.raises(ConfigError) as err:
        parse_config({"model": {"path": "m"}, "speculative": {"proposer": "ngram", "draft_length": draft_length}})
    assert problem in str(err.value)
