"""The ``suffix`` proposer through its batch API: drafts from the request's own
text and from the global cache of finished outputs, draft length growing with
the match, confidence cut-off, budgets, lifecycle (finish / preemption / id
reuse), options validation and registration."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from speculant.config.sampling_params import SamplingParams
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.request import Request, RequestStatus
from speculant.plugins.manager import get_registry
from speculant.proposers.suffix import SuffixOptions, SuffixProposer

CPU_CONTEXT = SimpleNamespace(target=SimpleNamespace(device=torch.device("cpu")))


def make(**options) -> SuffixProposer:
    return SuffixProposer(SuffixOptions(**options), CPU_CONTEXT)  # type: ignore[arg-type]


def request(prompt: list[int], output: list[int] = (), request_id: str = "r") -> Request:
    req = Request(request_id=request_id, prompt=None, prompt_token_ids=list(prompt), params=SamplingParams(), seed=0)
    req.token_ids = list(prompt) + list(output)
    req.status = RequestStatus.RUNNING
    return req


def propose(proposer: SuffixProposer, *decodes: tuple[Request, int]) -> list[list[int]]:
    batch = StepBatch(decodes=[ScheduledRequest(req, 1, k) for req, k in decodes])
    p = proposer.propose(batch)
    cu = p.cu_num_draft_tokens.tolist()
    ids = p.token_ids.tolist()
    return [ids[cu[i]:cu[i + 1]] for i in range(len(decodes))]


def finish(proposer: SuffixProposer, req: Request, reason: str = "stop") -> None:
    req.status, req.finish_reason = RequestStatus.FINISHED, reason
    proposer.free(req.request_id)


def test_drafts_from_its_own_prompt():
    p = make(max_spec_factor=4.0)
    req = request([1, 2, 3, 4, 5, 9, 1, 2])
    assert propose(p, (req, 3)) == [[3, 4, 5]]
    assert propose(p, (req, 0)) == [[]]  # zero budget


def test_scored_draft_reports_the_match_length_and_the_expected_accepted_tokens():
    p = make(max_spec_factor=4.0)
    text = [5, 6, 7, 8, 9, 10, 11, 12]
    draft = p.scored_draft(request(text + [42, 5, 6, 7]), 3)
    assert (draft.tokens, draft.match_len, draft.score) == ([8, 9, 10], 3, 3.0)  # one occurrence: sure
    split = p.scored_draft(request([1, 2, 3, 1, 2, 4, 1, 2], request_id="b"), 2)  # [1 2] went on with 3, then 4
    # the most recent occurrence wins the tie (share 1/2), then goes on alone: 0.5 + 0.5
    assert (split.tokens, split.match_len, split.score) == ([4, 1], 2, 1.0)
    assert p.scored_draft(request([1, 2, 3], request_id="c"), 2) == type(draft)(0.0, [], 0)  # no match


def test_draft_length_grows_with_the_match():
    p = make(max_spec_factor=1.0)  # a match of m tokens drafts at most m
    text = [5, 6, 7, 8, 9, 10, 11, 12]
    assert propose(p, (request(text + [40, 7]), 8)) == [[8]]
    assert propose(p, (request(text + [41, 6, 7], request_id="b"), 8)) == [[8, 9]]
    # 3 tokens: found at level 2, then extended to the full match
    assert propose(p, (request(text + [42, 5, 6, 7], request_id="c"), 8)) == [[8, 9, 10]]
    assert propose(p, (request(text + [43, 5, 6, 7, 8], request_id="d"), 8)) == [[9, 10, 11, 12]]


def test_follows_the_most_frequent_continuation_and_stops_when_unsure():
    # after [1, 2]: 3 twice, 4 once; after [1, 2, 3]: 7 and 8 once each (the most recent wins ties)
    p = make(max_spec_factor=8.0, min_token_prob=0.0)
    req = request([1, 2, 3, 7, 50, 1, 2, 4, 51, 1, 2, 3, 8, 52, 1, 2])
    assert propose(p, (req, 3)) == [[3, 8, 52]]  # path probabilities 2/3, 1/3, 1/3
    strict = make(max_spec_factor=8.0, min_token_prob=0.5)
    assert propose(strict, (req, 3)) == [[3]]  # 2/3, then 2/3 * 1/2 < 0.5


def test_finished_outputs_feed_later_requests():
    p = make(max_spec_factor=4.0)
    done = request([100, 101], [7, 8, 9, 10, 11, 12], request_id="a")
    propose(p, (done, 2))  # the proposer now follows 'a'
    finish(p, done)
    assert [t for _, t in p.cache.sequences] == [[7, 8, 9, 10, 11, 12]]
    later = request([200, 201, 7, 8], request_id="b")  # its own text has no match for [7, 8]
    assert propose(p, (later, 3)) == [[9, 10, 11]]


def test_preempted_or_failed_requests_are_not_cached_and_rebuild():
    p = make(max_spec_factor=4.0)
    req = request([1, 2, 3, 1, 2], request_id="a")
    assert propose(p, (req, 1)) == [[3]]
    p.free("a")  # preempted / reset: still running
    assert not p.cache.sequences and "a" not in p._state
    req.token_ids += [3, 1]
    assert propose(p, (req, 2)) == [[2, 3]]  # rebuilt from token_ids
    finish(p, req, reason="abort")
    assert not p.cache.sequences


def test_request_id_reuse_gets_a_fresh_index():
    p = make(max_spec_factor=4.0)
    assert propose(p, (request([1, 2, 3, 1, 2], request_id="x"), 1)) == [[3]]
    assert propose(p, (request([4, 5, 6, 4, 5], request_id="x"), 1)) == [[6]]


def test_cache_holds_at_most_max_cached_requests():
    p = make(max_cached_requests=2)
    for i in range(4):
        req = request([1000 + i], [i, i + 1, i + 2], request_id=f"r{i}")
        propose(p, (req, 1))
        finish(p, req, reason="length")
    assert [t for _, t in p.cache.sequences] == [[2, 3, 4], [3, 4, 5]]


@pytest.mark.parametrize("options,fragment", [
    ({"max_match_len": 0}, "greater than or equal to 1"),
    ({"min_token_prob": 1.5}, "less than or equal to 1"),
    ({"max_cached_requests": -1}, "greater than or equal to 0"),
    ({"max_spec_factor": 0}, "greater than 0"),
    ({"depth": 4}, "Extra inputs are not permitted"),
])
def test_options_are_validated(options, fragment):
    with pytest.raises(ValidationError, match=fragment):
        SuffixOptions(**options)


def test_registered_with_its_capabilities():
    cls = get_registry().get("proposer", "suffix")
    caps = cls.capabilities
    assert cls is SuffixProposer
    assert (caps.draft_probs, caps.needs_target_hidden_states, caps.supports_chunked_prefill,
            caps.max_num_speculative_tokens) == ("one_hot", False, True, None)
