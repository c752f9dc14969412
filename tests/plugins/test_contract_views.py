"""The contract's own pieces: the version check, the read-only views, and the
checks of tree-shaped data."""

from __future__ import annotations

import pytest
import torch

from speculant.engine.batch import ScheduledRequest as EngineEntry
from speculant.engine.batch import StepBatch as EngineBatch
from speculant.engine.proposal_checks import check_proposals
from speculant.engine.request import Request
from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.plugin_api import (
    API_VERSION,
    AcceptedNodes,
    Proposals,
    Proposer,
    SamplingParams,
    TokenIds,
    version_problem,
)


class _Declared(Proposer):
    name = "declared"

    def propose(self, batch):
        return Proposals.empty(len(batch.decodes))


def _with_version(version: object | None) -> type:
    attrs = {} if version is None else {"api_version": version}
    return type("Declared", (_Declared,), {**attrs, "__module__": "pkg.mod"})


def test_the_current_major_version_is_accepted():
    assert API_VERSION == "3.0"
    assert version_problem(_with_version("3.0"), "proposer") is None
    assert version_problem(_with_version("3.7"), "proposer") is None


def test_a_plugin_without_a_version_is_refused_with_the_fix():
    assert version_problem(_with_version(None), "proposer") == (
        "proposer 'declared' (pkg.mod.Declared) declares no api_version; this speculant implements plugin "
        "API 3.0. Port it to API 3.0 (see speculant.plugin_api) and set the class attribute api_version = '3.0'")


def test_another_major_version_is_refused_with_the_fix():
    assert version_problem(_with_version("1.3"), "scorer") == (
        "scorer 'declared' (pkg.mod.Declared) targets plugin API 1.3, but this speculant implements 3.0 "
        "(another major version: the methods it calls or implements differ). Port it to API 3.0 and set "
        "api_version = '3.0', or install a speculant release that implements API 1.3")


def test_a_malformed_version_is_refused():
    msg = version_problem(_with_version(2), "proposer")
    assert msg is not None and "declares api_version = 2, which is not a 'MAJOR.MINOR' string" in msg


def _request(tokens: list[int]) -> Request:
    return Request("r0", None, tokens[:3], SamplingParams(temperature=0.0), seed=0, token_ids=list(tokens))


def test_token_ids_view_fixes_its_length_and_slices_like_a_list():
    ids = [5, 6, 7, 8]
    view = TokenIds(ids)
    ids.append(9)  # the engine appends later: the view read before keeps its length
    plain = [5, 6, 7, 8]
    assert len(view) == 4 and list(view) == plain and view == plain
    for key in (slice(1, 3), slice(-2, None), slice(None, None, -1), slice(-2, None, -1), slice(2, 0, -1)):
        assert view[key] == plain[key], key
    assert view[-1] == 8 and view[0] == 5
    with pytest.raises(IndexError):
        view[4]


def test_the_request_view_is_live_and_read_only():
    req = _request([1, 2, 3, 4])
    view = req.view
    assert view is req.view and view.token_ids == [1, 2, 3, 4] and view.num_output_tokens == 1
    req.token_ids.append(7)
    assert view.token_ids == [1, 2, 3, 4, 7] and view.output_token_ids == [4, 7]
    assert view.prompt_token_ids == [1, 2, 3]
    with pytest.raises(AttributeError):
        view.token_ids = [0]  # type: ignore[misc]
    with pytest.raises(AttributeError):
        view.extra = 1  # type: ignore[attr-defined]


def test_the_batch_view_is_built_once_and_is_frozen():
    req = _request([1, 2, 3, 4])
    req.num_computed_tokens = 3
    batch = EngineBatch(decodes=[EngineEntry(req, 1, 2, [0])])
    view = batch.view()
    assert view is batch.view()
    (d,) = view.decodes
    assert (d.start, d.num_spec_tokens, d.samples, d.sequence, d.request_id) == (3, 2, True, None, "r0")
    assert not hasattr(d, "block_table")  # plugins name KV by handle, never by block ids
    with pytest.raises(AttributeError):
        d.num_spec_tokens = 4  # type: ignore[misc]


def test_tree_proposals_are_refused_where_trees_are_off():
    req = _request([1, 2, 3, 4])
    req.num_computed_tokens = 3
    batch = EngineBatch(decodes=[EngineEntry(req, 1, 2, [0])]).view()
    chain = Proposals.from_lists([[5, 6]])
    tree = Proposals(chain.token_ids, chain.cu_num_draft_tokens, parents=torch.tensor([-1, -1]))
    assert check_proposals(chain, batch, 16).problems == []
    checked = check_proposals(tree, batch, 16)
    assert checked.structural and checked.proposals.num_draft_tokens == 0
    assert checked.problems == ["set Proposals.parents (a token tree), but this engine asks for trees only with "
                                "speculative.tree_width > 1 and a proposer that declares proposes_trees: return "
                                "parents=None, each decode's proposals as one chain"]
    taken = check_proposals(tree, batch, 16, tree_width=2)
    assert taken.problems == [] and taken.proposals.parents.tolist() == [-1, -1]


@pytest.mark.parametrize("parents, tokens, probs, problem", [
    ([-1, 1], [5, 6], False, "the tree of row 0 node 1 has parent 1, outside -1..0"),
    ([-1, -1], [5, 5], False, "the tree of row 0 siblings [0, 1] repeat a token ([5, 5])"),
    ([-1, -1, -1], [5, 6, 7], False, "the tree of row 0 a node has 3 children, above speculative.tree_width = 2"),
    ([-1, -1], [5, 6], True, None),  # drafts drawn from a distribution: taken with their probs
])
def test_malformed_trees_are_refused_with_the_reason(parents, tokens, probs, problem):
    req = _request([1, 2, 3, 4])
    req.num_computed_tokens = 3
    batch = EngineBatch(decodes=[EngineEntry(req, 1, 3, [0])]).view()
    tree = Proposals(torch.tensor(tokens), torch.tensor([0, len(tokens)]),
                     probs=torch.full((len(tokens), 16), 1 / 16) if probs else None, parents=torch.tensor(parents))
    checked = check_proposals(tree, batch, 16, tree_width=2)
    if problem is None:
        assert checked.problems == [] and checked.proposals.probs.shape == (2, 16)
        assert checked.proposals.parents.tolist() == parents
        return
    assert checked.proposals.num_draft_tokens == 0 and checked.problems[0].startswith(problem)


def test_tree_spans_run_with_their_positions_and_mask():
    chain = PagedSpan([0, 1], 2, [5, 6], [1], positions=[2, 3])
    assert SpanTensors.build([chain], 4, torch.device("cpu")).positions.tolist() == [2, 3]
    tree = PagedSpan([0, 1], 2, [5, 6, 7], [1], positions=[2, 3, 3],
                     ancestor_mask=[[True, False, False], [True, True, False], [True, False, True]])
    built = SpanTensors.build([chain, tree], 4, torch.device("cpu"))
    assert built.positions.tolist() == [2, 3, 2, 3, 3]
    assert built.slot_mapping.tolist() == [2, 3, 2, 3, 4]  # node i in slot start + i, whatever its depth
    assert built.mask_offsets.tolist() == [-1, 0]
    assert built.tree_masks.tolist() == [1, 0, 0, 1, 1, 0, 1, 0, 1]
    assert SpanTensors.build([chain], 4, torch.device("cpu")).tree_masks is None


def test_accepted_nodes_read_as_counts_for_chain_proposers():
    accepted = AcceptedNodes.chain([2, 0, 3])
    assert accepted == [2, 0, 3] and accepted[0] == 2
    assert accepted.nodes == [[0, 1], [], [0, 1, 2]]
