"""engine/tree_shape.py: rank paths, the branch record, best-first plans, wide trees
on a flat cost curve and chains on a steep one, pruning, and the engine's report."""

from __future__ import annotations

import pytest
import torch

from speculant.config.models import SpeculativeConfig
from speculant.config.sampling_params import SamplingParams
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.cost_model import CostCurve, CostModel
from speculant.engine.request import Request, RequestStatus
from speculant.engine.tree_shape import (
    AdaptiveTreeShapes,
    BranchRecord,
    best_first,
    best_prefix,
    build_policy,
    node_gains,
    rank_paths,
)
from speculant.interfaces import Proposals

FLAT = CostCurve((1, 2, 4, 8, 16, 32), (1.0, 1.0, 1.01, 1.02, 1.04, 1.08))  # a forward that streams its weights
STEEP = CostCurve((1, 2, 4, 8, 16), (1.0, 1.6, 2.5, 4.2, 7.14))  # compute-bound (1.5B Q4_K_M: t(16)/t(1) 7.14)


def decoding(request_id: str) -> Request:
    req = Request(request_id=request_id, prompt=None, prompt_token_ids=[1, 2], params=SamplingParams(), seed=0)
    req.token_ids = [1, 2, 3]
    req.num_computed_tokens, req.status = 2, RequestStatus.RUNNING
    return req


def policy(curve: CostCurve, width: int = 3, nodes: int = 16, depth: int = 6, prior: float = 0.5,
           draft_cost: float = 0.0) -> AdaptiveTreeShapes:
    spec = SpeculativeConfig(proposer="ngram", num_speculative_tokens=depth, tree_width=width, max_tree_tokens=nodes,
                             draft_length={"policy": "adaptive", "prior_acceptance": prior})
    built = build_policy(spec, CostModel(curve, draft_cost))
    assert isinstance(built, AdaptiveTreeShapes)
    return built


def planned(p: AdaptiveTreeShapes, rid: str = "r0") -> set[tuple[int, ...]]:
    return set(p.shapes[rid])


def test_rank_paths_name_each_node_by_its_sibling_ranks():
    #        root
    #       /    \
    #      0      1
    #     / \     |
    #    2   3    4
    assert rank_paths([-1, -1, 0, 0, 1]) == [(0,), (1,), (0, 0), (0, 1), (1, 0)]
    assert rank_paths([-1, 0, 1]) == [(0,), (0, 0), (0, 0, 0)]


def test_best_first_puts_parents_first_and_gains_never_rise():
    rec = BranchRecord.empty(depth=5, width=3, acceptance=0.6)
    plan = best_first(rec, 14, width=3, depth=5)
    gains = [g for g, _ in plan]
    assert gains == sorted(gains, reverse=True) and len(plan) == 14
    seen = set()
    for _, path in plan:
        assert len(path) == 1 or path[:-1] in seen, path  # the parent came earlier
        assert path[-1] == 0 or path[:-1] + (path[-1] - 1,) in seen  # so did the elder sibling
        seen.add(path)
    assert plan[0] == (pytest.approx(0.6), (0,)) and plan[1] == (pytest.approx(0.36), (0, 0))


def test_a_flat_cost_curve_buys_wide_trees_and_a_steep_one_falls_back_to_a_chain():
    flat, steep = policy(FLAT), policy(STEEP, prior=0.8)
    req = decoding("r0")
    flat_k = flat.plan([req])["r0"]
    wide = planned(flat)
    assert flat_k == 16 and len(wide) == 16 and any(p[-1] > 0 for p in wide), wide  # siblings pay when rows are free
    steep_k = steep.plan([req])["r0"]
    chain = planned(steep)
    assert steep_k == 16 and chain == {(0,), (0, 0)}, chain  # first children only: a chain
    m = flat.metrics()
    assert m["planned_branching_fraction"] == 1.0 and m["mean_planned_tree_nodes"] == 16
    assert steep.metrics()["planned_branching_fraction"] == 0.0


def test_a_hopeless_request_drafts_nothing_on_a_steep_curve():
    p = policy(STEEP, prior=0.05)
    assert p.plan([decoding("r0")]) == {"r0": 0} and planned(p) == set()


def test_observed_branch_acceptance_moves_the_plan_to_that_branch():
    """A request whose second root child keeps being the accepted one gets that branch's subtree."""
    p = policy(CostCurve((1, 2, 4, 8, 16), (1.0, 1.3, 1.6, 2.2, 3.4)), width=2, nodes=16, depth=4)
    req = decoding("r0")
    p.plan([req])
    before = planned(p)
    assert (1, 0) not in before  # under the prior, the rank-1 branch is not worth growing
    parents = [-1, 0, 1, -1, 3, 4]  # the first child's chain (nodes 0-2), then the second child's (3-5)
    for _ in range(6):
        p.plan([req])
        batch = StepBatch(decodes=[ScheduledRequest(req, 1, 6)])
        p.verified(batch, Proposals(torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([0, 6]),
                                    parents=torch.tensor(parents)))
        p.observe(batch, [[3, 4, 5]])  # the target followed the second child for three levels
    rec = p.record("r0")
    assert rec.q(1, 1) > 0.7 and rec.q(1, 0) < 0.2
    p.plan([req])
    after = planned(p)
    assert {(1,), (1, 0), (1, 0, 0)} <= after, after


def test_a_new_request_starts_from_what_earlier_requests_showed():
    """The pool: after one request's 8-node chains were accepted whole, the next request's
    first plan is that deep chain, where a fresh policy's prior gives a short one."""
    curve = CostCurve((1, 2, 4, 8, 16), (1.0, 1.13, 1.23, 1.59, 2.38))  # SmolLM2 bf16, 2 threads
    seen, fresh = policy(curve, width=2, nodes=8, depth=8), policy(curve, width=2, nodes=8, depth=8)
    first, second = decoding("r0"), decoding("r1")
    batch = StepBatch(decodes=[ScheduledRequest(first, 1, 8)])
    for _ in range(12):
        seen.plan([first])
        seen.verified(batch, Proposals(torch.arange(8), torch.tensor([0, 8]), parents=torch.arange(-1, 7)))
        seen.observe(batch, [list(range(8))])
    seen.free("r0")
    seen.plan([second])
    fresh.plan([second])
    assert planned(seen, "r1") == {(0,) * d for d in range(1, 9)}
    assert len(planned(fresh, "r1")) < 8 and seen.record("r1").q(1, 0) > fresh.record("r1").q(1, 0) + 0.3


def test_a_level_not_reached_yet_inherits_the_acceptance_above_it():
    rec = BranchRecord.empty(depth=6, width=2, acceptance=0.5)
    for _ in range(8):  # two-node chains, both accepted every time
        rec.observe([-1, 0], [0, 1], decay=0.8)
    q = rec.table()
    assert q[0][0] > 0.8 and q[1][0] > q[0][0]  # seen (the deeper one on top of what the level above showed)
    assert q[5][0] == pytest.approx(q[1][0]) and q[2][0] == pytest.approx(q[1][0])  # never offered: inherited


def test_a_request_held_at_no_nodes_is_tried_again():
    """Rejections push a request below the bar of a steep curve; steps without a tree bring the prior back."""
    p = policy(STEEP, prior=0.8)
    req = decoding("r0")
    batch = StepBatch(decodes=[ScheduledRequest(req, 1, 2)])
    rejected = 0
    while p.plan([req])["r0"] > 0:  # its proposals rejected every step
        rejected += 1
        assert rejected < 10, "rejections never lowered the plan"
        p.verified(batch, Proposals(torch.tensor([5]), torch.tensor([0, 1]), parents=torch.tensor([-1])))
        p.observe(batch, [[]])
    assert rejected > 0
    held = 0
    while not p.shapes["r0"]:  # nothing verified: the counts fade
        held += 1
        assert held < 30, "never tried again"
        p.verified(batch, Proposals.empty(1))
        p.observe(batch, [[]])
        p.plan([req])
    assert held > 0


def test_prune_keeps_the_planned_rank_paths_and_renumbers_parents():
    p = policy(STEEP, prior=0.8)
    req, other = decoding("r0"), decoding("r1")
    p.plan([req])  # r1 is not planned (as if its drafts were fixed): its tree stays whole
    assert planned(p) == {(0,), (0, 0)}
    tokens = [[7, 8, 9, 10, 11, 12], [1, 2, 3]]
    parents = [[-1, -1, 0, 2, 0, 3], [-1, -1, 0]]  # r0: rank paths (0,) (1,) (0,0) (0,0,0) (0,1) (0,0,0,0)
    out = Proposals.from_lists(tokens)
    proposals = Proposals(out.token_ids, out.cu_num_draft_tokens,
                          parents=torch.tensor([q for ps in parents for q in ps]))
    batch = StepBatch(decodes=[ScheduledRequest(req, 1, 6), ScheduledRequest(other, 1, 3)])
    pruned = p.prune(batch, proposals)
    assert pruned.to_lists() == [[7, 9], [1, 2, 3]]
    assert pruned.parents_lists() == [[-1, 0], [-1, -1, 0]] and pruned.probs is None
    probs = torch.softmax(torch.randn(9, 16, generator=torch.Generator().manual_seed(0)), dim=1)  # [T, V]
    with_probs = p.prune(batch, Proposals(proposals.token_ids, proposals.cu_num_draft_tokens, probs,
                                          proposals.parents))
    assert torch.equal(with_probs.probs, probs[[0, 2, 6, 7, 8]])  # a draft's distributions follow its nodes


def tree_proposals(tokens: list[list[int]], parents: list[list[int]]) -> Proposals:
    out = Proposals.from_lists(tokens)
    return Proposals(out.token_ids, out.cu_num_draft_tokens, parents=torch.tensor([q for ps in parents for q in ps]))


def test_prune_keeps_the_depth_of_an_offered_chain_where_the_plan_hoped_for_siblings():
    """A suffix tree with one occurrence is a chain: the rows the plan set aside for
    siblings go to its depth instead of being left unused."""
    p = policy(FLAT, nodes=8, depth=8, prior=0.9)
    req = decoding("r0")
    p.plan([req])
    assert any(path[-1] > 0 for path in planned(p))  # the plan counted on siblings ...
    assert max(len(path) for path in planned(p)) < 8
    batch = StepBatch(decodes=[ScheduledRequest(req, 1, 8)])
    pruned = p.prune(batch, tree_proposals([list(range(10, 18))], [list(range(-1, 7))]))
    assert pruned.to_lists() == [list(range(10, 18))]  # ... the offered chain is verified whole
    assert p.metrics()["mean_verified_tree_nodes"] == 8 and p.metrics()["verified_branching_fraction"] == 0


@pytest.mark.parametrize("curve, branching", [(FLAT, True), (STEEP, False)])
def test_a_tree_is_verified_only_where_it_beats_its_own_first_branch(curve, branching):
    p = policy(curve, width=2, nodes=16, depth=6, prior=0.8)
    req = decoding("r0")
    p.plan([req])
    parents = [-1, 0, 1, 2, -1, 4, 0]  # chain 0-3, a root sibling 4 with child 5, and node 6 under node 0
    batch = StepBatch(decodes=[ScheduledRequest(req, 1, 7)])
    kept = p.choose(batch, [parents], [True])[0]
    gains, paths = node_gains(p.record("r0").table(), parents)
    chain = [j for j in range(7) if not any(paths[j])]
    n_chain, chain_ratio = best_prefix(sorted((gains[j] for j in chain), reverse=True), 1, 1.0, 0, p.cost)
    n_all, all_ratio = best_prefix(sorted(gains, reverse=True), 1, 1.0, 0, p.cost)
    assert (all_ratio > chain_ratio) == branching
    assert kept == (sorted(j for j in range(7) if gains[j] >= sorted(gains, reverse=True)[n_all - 1])
                    if branching else chain[:n_chain])
    assert all(parents[j] < 0 or parents[j] in kept for j in kept)  # closed under parents


def test_best_prefix_takes_a_doubtful_node_for_the_sure_ones_behind_it():
    """All-or-nothing acceptance (a copied span): the first node alone does not pay on this
    curve, the run behind it does; the best prefix is the whole run."""
    cost = CostModel(CostCurve((1, 2, 10), (1.0, 1.3, 1.6)), 0.0)
    gains = [0.25] + [0.25 * 0.99 ** k for k in range(1, 9)]
    assert 1.25 / 1.3 < 1.0  # one node: worse than none
    n, ratio = best_prefix(gains, 1, 1.0, 0, cost)
    assert n == 9 and ratio == pytest.approx((1 + sum(gains)) / 1.6)
    assert best_prefix(gains, 1, 1.0, 0, CostModel(CostCurve((1, 2, 10), (1.0, 1.3, 4.0)), 0.0))[0] == 0


def test_the_engine_reports_tree_shapes_and_keeps_greedy_output(tmp_path, tokenizer_dir):
    """Adaptive trees end to end: the plans are counted, and the output is that of no speculation."""
    from speculant import LLM
    from tiny_models import build_model

    model = build_model("llama", tmp_path / "m", tokenizer_dir, vocab_size=16, seed=7)
    prompts = [torch.randint(16, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 9, 17)]
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = LLM(model=str(model), block_size=4, num_blocks=128).generate(prompts, greedy, use_tqdm=False)
    llm = LLM(model=str(model), block_size=4, num_blocks=128,
              speculative={"proposer": "ngram", "num_speculative_tokens": 4, "tree_width": 3, "max_tree_tokens": 12,
                           "draft_length": {"policy": "adaptive", "token_cost": 0.01}})
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    m = llm.get_metrics()
    assert m["tree_policy"] == "adaptive_shape" and m["mean_planned_tree_nodes"] > 1, m
    assert m["planned_branching_fraction"] > 0 and m["num_accepted_tokens"] > 0, m
