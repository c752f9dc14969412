"""check_proposals: every kind of bad proposer output is caught, named, and
confined to the rows it affects; good output passes unchanged."""

from __future__ import annotations

import torch

from speculant.config.sampling_params import SamplingParams
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.proposal_checks import PROB_SUM_TOLERANCE, check_proposals
from speculant.engine.request import Request, RequestStatus
from speculant.interfaces import PLACEHOLDER_TOKEN_ID, Proposals

V = 10


def batch(budgets=(3, 2, 3), sampling=(True, True, False)) -> StepBatch:
    decodes = []
    for i, (k, s) in enumerate(zip(budgets, sampling)):
        req = Request(request_id=f"r{i}", prompt=None, prompt_token_ids=[1, 2, 3],
                      params=SamplingParams(temperature=1.0 if s else 0.0), seed=i)
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
    return Proposals.from_padded(ids, torch.tensor([3, 2, 1]), probs)


def test_from_padded_is_flat():
    p = good()
    assert p.token_ids.tolist() == [1, 2, 3, 4, 5, 6] and p.cu_num_draft_tokens.tolist() == [0, 3, 5, 6]
    assert p.lens.tolist() == [3, 2, 1] and p.probs.shape == (6, V) and p.probs[5].sum() == 0


def test_good_output_passes_unchanged():
    checked = check_proposals(good(), batch(), V)
    assert checked.problems == [] and checked.bad_rows == []
    assert torch.equal(checked.proposals.token_ids, good().token_ids)
    assert torch.equal(checked.proposals.cu_num_draft_tokens, good().cu_num_draft_tokens)
    assert torch.equal(checked.proposals.probs, good().probs)


def test_row_faults_drop_only_their_rows():
    p = good()
    ids = p.token_ids.clone()
    ids[4] = V  # row 1's second proposal: out of vocabulary
    probs = p.probs.clone()
    probs[2, 0] = float("nan")  # row 0's third proposal
    checked = check_proposals(Proposals(ids, p.cu_num_draft_tokens, probs), batch(), V)
    assert checked.bad_rows == [0, 1]
    text = "; ".join(checked.problems)
    assert "outside the vocabulary [0, 10)" in text and "not finite" in text
    assert checked.proposals.lens.tolist() == [0, 0, 1]
    assert checked.proposals.token_ids.tolist() == [6]  # only row 2's proposal is left
    assert checked.proposals.probs.shape == (1, V) and torch.isfinite(checked.proposals.probs).all()


def test_lens_over_budget_drop_the_row():
    ids = torch.tensor([[1, 2, 3], [4, 5, 7], [6, 0, 0]])
    checked = check_proposals(Proposals.from_padded(ids, torch.tensor([3, 3, 1])), batch(), V)  # budget 2
    assert checked.bad_rows == [1] and "outside [0, budget]" in checked.problems[0]
    assert checked.proposals.to_lists() == [[1, 2, 3], [], [6]]


def test_probs_not_a_distribution_on_sampling_rows():
    p = good()
    half = p.probs.clone()
    half[3:5] *= 0.5  # row 1
    checked = check_proposals(Proposals(p.token_ids, p.cu_num_draft_tokens, half), batch(), V)
    assert checked.bad_rows == [1] and f"do not sum to 1 within {PROB_SUM_TOLERANCE}" in checked.problems[0]
    neg = p.probs.clone()
    neg[0, 0], neg[0, 1] = -0.1, 0.3  # row 0, still sums to 1
    checked = check_proposals(Proposals(p.token_ids, p.cu_num_draft_tokens, neg), batch(), V)
    assert checked.bad_rows == [0] and "negative" in checked.problems[0]


def test_structural_faults_drop_everything():
    b, p = batch(), good()
    ids, cu = p.token_ids, p.cu_num_draft_tokens
    cases = {
        "returned NoneType": None,
        "token_ids must be an integer tensor": Proposals(ids.float(), cu, p.probs),
        "(flat)": Proposals(ids.view(2, 3), cu),  # a padded table where the flat list belongs
        "one row per decode": Proposals(ids[:5], cu[:3]),
        "cu_num_draft_tokens must be an integer tensor": Proposals(ids, cu.float(), p.probs),
        "never decrease": Proposals(ids, torch.tensor([0, 3, 2, 6]), p.probs),  # a negative length
        "end at len(token_ids) = 5": Proposals(ids[:5], cu),
        "probs must be None or a float tensor": Proposals(ids, cu, p.probs[:, :5]),
    }
    for expected, out in cases.items():
        checked = check_proposals(out, b, V)
        assert checked.structural and checked.bad_rows == [0, 1, 2], expected
        assert expected in checked.problems[0], (expected, checked.problems)
        assert checked.proposals.lens.tolist() == [0, 0, 0] and checked.proposals.token_ids.shape == (0,)
