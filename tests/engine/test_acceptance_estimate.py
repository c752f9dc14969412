"""The adaptive policy's per-position acceptance estimate
(``engine/acceptance_estimate.py``) on made-up verify records, and the draft
length the policy picks from it: the k with the most expected tokens per unit
of cost."""

from __future__ import annotations

import random

import pytest

from speculant.config.models import SpeculativeConfig
from speculant.config.sampling_params import SamplingParams
from speculant.engine.acceptance_estimate import OFFER_DECAY, OFFER_DRIFT, PositionAcceptance
from speculant.engine.cost_model import CostCurve, CostModel
from speculant.engine.draft_length import AdaptiveDraftLength
from speculant.engine.request import Request, RequestStatus

K = 8


def record(steps: list[tuple[int, int]], decay: float = 0.95, prior: float = 0.5) -> PositionAcceptance:
    est = PositionAcceptance(prior, decay)
    for drafted, accepted in steps:
        est.observe(drafted, accepted)
    return est


def geometric(rate: float, n: int, seed: int = 0) -> list[tuple[int, int]]:
    """n verify steps of K drafts, each kept with probability ``rate`` until the first rejection."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = 0
        while a < K and rng.random() < rate:
            a += 1
        out.append((K, a))
    return out


def all_or_nothing(p_whole: float, n: int, seed: int = 0) -> list[tuple[int, int]]:
    """n verify steps of K drafts: all kept with probability ``p_whole``, else none (a copied span)."""
    rng = random.Random(seed)
    return [(K, K if rng.random() < p_whole else 0) for _ in range(n)]


def test_before_any_record_every_position_has_the_prior():
    est = PositionAcceptance(0.6, 0.8)
    assert est.rates(K) == pytest.approx([0.6] * K)
    assert est.gains(3) == pytest.approx([0.6, 0.36, 0.216])


def test_a_geometric_record_gives_geometric_gains():
    est = record(geometric(0.7, 4000), decay=0.999)
    assert est.rates(6) == pytest.approx([0.7] * 6, abs=0.04)
    assert est.gains(6) == pytest.approx([0.7 ** j for j in range(1, 7)], abs=0.05)


def test_an_all_or_nothing_record_keeps_long_drafts_valuable():
    est = record(all_or_nothing(0.5, 4000), decay=0.999)
    rates = est.rates(K)
    assert rates[0] == pytest.approx(0.5, abs=0.04)
    assert rates[1:] == pytest.approx([1.0] * (K - 1), abs=1e-3)  # reached, always kept
    assert est.gains(K) == pytest.approx([rates[0]] * K, abs=1e-3)
    # one rate for all positions (accepted / (accepted + rejections)) would price the 8th at a ** 8
    accepted = sum(a for _, a in all_or_nothing(0.5, 4000))
    rejections = sum(a < d for d, a in all_or_nothing(0.5, 4000))
    assert (accepted / (accepted + rejections)) ** K < 0.8 * est.gains(K)[-1]


def test_positions_never_reached_inherit_the_last_rate():
    est = record([(2, 2)] * 30, decay=0.8)  # drafts of 2, always kept: positions 3.. never reached
    rates = est.rates(5)
    assert rates[0] > 0.99 and rates[2:] == pytest.approx([rates[1]] * 3)


def test_evidence_outweighs_the_prior_and_drift_brings_it_back():
    est = record([(4, 0)] * 40, decay=0.8, prior=0.5)
    assert est.rates(1)[0] < 0.01  # always rejected: no floor from the prior
    for _ in range(60):
        est.drift()
    assert est.rates(4) == pytest.approx([0.5] * 4, abs=0.01)


def test_nothing_offered_is_not_a_rejection_but_lowers_the_offer_rate():
    est = record([(4, 4), (4, 1)], decay=0.5, prior=0.5)
    rates = est.rates(4)
    est.nothing_offered()  # asked, got nothing: no position reached
    assert est.rates(4) == pytest.approx(rates)
    # three asks, decayed by OFFER_DECAY each, the last one empty; the prior (1) worth 2 at first
    f = OFFER_DECAY
    asked, offered, weight = f * f + f + 1, f * f + f, 2 * f ** 3
    offer = (offered + weight) / (asked + weight)
    assert est.offer_rate() == pytest.approx(offer)
    gains, run = [], offer
    for r in rates:
        run *= r
        gains.append(run)
    assert est.gains(4) == pytest.approx(gains)
    # a step not asked ages the record by OFFER_DRIFT and restores the prior's weight, as for the positions
    g = OFFER_DRIFT
    est.drift()
    weight = g * weight + (1 - g) * 2
    assert est.offer_rate() == pytest.approx((g * offered + weight) / (g * asked + weight))
    assert est.rates(4) != pytest.approx(rates)  # positions drift only on steps not asked


def test_a_proposer_that_never_offers_is_asked_less_and_again_after_drift():
    est = PositionAcceptance(0.5, 0.8)
    for _ in range(40):
        est.nothing_offered()
    assert est.offer_rate() < 0.01 and est.rates(1) == [0.5]
    for _ in range(100):  # 1% of the way back per step without an ask
        est.drift()
    assert 0.1 < est.offer_rate() < 0.9
    for _ in range(900):
        est.drift()
    assert est.offer_rate() == pytest.approx(1.0, abs=0.001)


def test_a_record_accepting_more_than_it_drafted_is_refused():
    with pytest.raises(ValueError, match="accepts between 0 and the 2 drafted proposals, got 3"):
        PositionAcceptance(0.5, 0.8).observe(2, 3)


def lone_decode(steps: list[tuple[int, int]], curve: CostCurve, d: float) -> tuple[int, int]:
    """(k the policy plans for a lone decode with this record, k that maximises
    (1 + G_1 + ... + G_k) / (t(k + 1)/t(1) + k d) by brute force)."""
    policy = AdaptiveDraftLength(SpeculativeConfig(proposer="ngram", num_speculative_tokens=K,
                                                   draft_length={"policy": "adaptive", "acceptance_decay": 0.9}),
                                 CostModel(curve, d))
    req = Request(request_id="r", prompt=None, prompt_token_ids=[1, 2], params=SamplingParams(), seed=0)
    req.token_ids, req.num_computed_tokens, req.status = [1, 2, 3], 2, RequestStatus.RUNNING
    for drafted, accepted in steps:
        policy.plan([req])
        req.spec_stats.record(drafted, accepted)
    state = PositionAcceptance(0.5, 0.9, *(list(x) for x in (policy._state["r"].positions.reached,
                                                               policy._state["r"].positions.accepted,
                                                               policy._state["r"].positions.weight)))
    planned = policy.plan([req])["r"]
    state.observe(*steps[-1])  # what plan() folded in
    gains = state.gains(K)
    ratios = [(1 + sum(gains[:k])) / (curve.cost(k + 1) + k * d) for k in range(K + 1)]
    best = max(range(K + 1), key=lambda k: (ratios[k], -k))
    return planned, best


MEASURED = CostCurve((1, 2, 4, 8, 16, 32), (1.0, 1.0, 1.07, 1.23, 1.68, 2.98))  # SmolLM2 bf16, 2 threads
STEEP = CostCurve((1, 2, 4, 8, 16), (1.0, 1.3, 1.9, 3.1, 5.5))


@pytest.mark.parametrize("curve,d", [(MEASURED, 0.05), (MEASURED, 0.3), (STEEP, 0.0), (STEEP, 0.1)],
                         ids=["measured-cheap", "measured-dear", "steep-free", "steep"])
@pytest.mark.parametrize("steps", [
    all_or_nothing(0.5, 12, seed=1), all_or_nothing(0.2, 12, seed=2), geometric(0.6, 12, seed=3),
    geometric(0.9, 12, seed=4), geometric(0.2, 12, seed=5), [(8, 0)] * 12, [(8, 8)] * 12,
], ids=["whole-0.5", "whole-0.2", "geo-0.6", "geo-0.9", "geo-0.2", "all-rejected", "all-kept"])
def test_a_lone_decode_gets_the_k_with_most_tokens_per_cost(steps, curve, d):
    planned, best = lone_decode(steps, curve, d)
    assert planned == best


def test_all_or_nothing_edits_get_the_whole_draft_where_one_rate_would_cut_it():
    """Half of the drafts kept whole: the per-position estimate plans all 8; the
    geometric model with the same record's rate (accepted / (accepted +
    rejections) ~ 0.89) would price the 8th at ~0.4 and stop earlier on a steep curve."""
    steps = all_or_nothing(0.5, 40, seed=7)
    planned, best = lone_decode(steps, STEEP, 0.1)
    assert planned == best == K
