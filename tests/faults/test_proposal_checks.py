"""check_proposals: every kind of bad proposer output is caught, named, and
confined to the rows it affects; good output passes unchanged."""

from __future__ import annotations

import torch

from speculant.core.batch import ScheduledRequest, StepBatch
from speculant.core.proposal_checks import PROB_SUM_TOLERANCE, check_proposals
from speculant.core.request import Request, RequestStatus
from speculant.core.sampling_params import SamplingParams
from speculant.proposers.base import PLACEHOLDER_TOKEN_ID, Proposals

V = 10


def batch(budgets=(3, 2, 3), sampling=(True, True, False)) -> StepBatch:
    decodes = []
    for i, (k, s) in enumerate(zip(budgets, sampling)):
        req = Request(request_id=f"r{i}", prompt=None, prompt_token_ids=[1, 2, 3],
                      params=SamplingParams(temperature=1.0 if s else 0.0), arrival_index=i, seed=i)
        req.token_ids.append(4)
        req.num_computed_tokens = 3
        req.status = RequestStatus.RUNNING
        decodes.append(ScheduledRequest(req, 1, k))
    return StepBatch(decodes=decodes)


def good() -> Proposals:
    ids = torch.tensor([[1, 2, 3], [4, 5, PLACEHOLDER_TOKEN_ID], [6, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID]])
    probs = torch.zeros(3, 3, V)
    probs[0, :3] = 1.0 / V
    probs[1, :2] = 1.0 / V  # row 2 is greedy: its probs stay zero, as draft_model leaves them
    return Proposals(ids, torch.tensor([3, 2, 1]), probs)


def test_good_output_passes_unchanged():
    checked = check_proposals(good(), batch(), V)
    assert checked.problems == [] and checked.bad_rows == []
    assert torch.equal(checked.proposals.token_ids, good().token_ids)
    assert torch.equal(checked.proposals.lens, good().lens)


def test_row_faults_drop_only_their_rows():
    p = good()
    ids = p.token_ids.clone()
    ids[1, 1] = V  # out of vocabulary, inside lens
    probs = p.probs.clone()
    probs[0, 2, 0] = float("nan")
    checked = check_proposals(Proposals(ids, p.lens, probs), batch(), V)
    assert checked.bad_rows == [0, 1]
    text = "; ".join(checked.problems)
    assert "outside the vocabulary [0, 10)" in text and "not finite" in text
    assert checked.proposals.lens.tolist() == [0, 0, 1]
    assert checked.proposals.token_ids[:2].eq(PLACEHOLDER_TOKEN_ID).all()
    assert torch.isfinite(checked.proposals.probs).all()


def test_lens_outside_budget_and_negative():
    p = good()
    checked = check_proposals(Proposals(p.token_ids, torch.tensor([3, 3, -1]), p.probs), batch(), V)
    assert checked.bad_rows == [1, 2] and "outside [0, budget]" in checked.problems[0]


def test_probs_not_a_distribution_on_sampling_rows():
    p = good()
    half = p.probs.clone()
    half[1] *= 0.5
    checked = check_proposals(Proposals(p.token_ids, p.lens, half), batch(), V)
    assert checked.bad_rows == [1] and f"do not sum to 1 within {PROB_SUM_TOLERANCE}" in checked.problems[0]
    neg = p.probs.clone()
    neg[0, 0, 0], neg[0, 0, 1] = -0.1, 0.3  # still sums to 1
    checked = check_proposals(Proposals(p.token_ids, p.lens, neg), batch(), V)
    assert checked.bad_rows == [0] and "negative" in checked.problems[0]


def test_structural_faults_drop_everything():
    b, p = batch(), good()
    cases = {
        "returned NoneType": None,
        "token_ids must be an integer tensor": Proposals(p.token_ids.float(), p.lens, p.probs),
        "one row per decode": Proposals(p.token_ids[:2], p.lens[:2]),
        "lens must be an integer tensor": Proposals(p.token_ids, p.lens.float(), p.probs),
        "probs must be None or a float tensor": Proposals(p.token_ids, p.lens, p.probs[:, :, :5]),
    }
    for expected, out in cases.items():
        checked = check_proposals(out, b, V)
        assert checked.structural and checked.bad_rows == [0, 1, 2], expected
        assert expected in checked.problems[0], (expected, checked.problems)
        assert checked.proposals.lens.tolist() == [0, 0, 0] and checked.proposals.token_ids.shape == (3, 0)
