"""Suffix-decoding proposer (model-free, after SuffixDecoding, arXiv 2411.04975):
propose the most frequent continuation of the sequence's longest matching
suffix, found in the request's own prompt + output and in the outputs of past
requests, with a draft length that grows with the match and its confidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from speculant.interfaces import Proposals, Proposer, ProposerCapabilities, ProposerContext
from speculant.interfaces.tree import tree_settings
from speculant.proposers.suffix_index import (
    POS_BITS,
    POS_MASK,
    SuffixCache,
    SuffixIndex,
    deepest,
    extend_hashes,
    match_levels,
    vote,
    vote_tree,
)

if TYPE_CHECKING:
    from speculant.interfaces.batch import RequestView, StepBatch


class SuffixOptions(BaseModel):
    """Options of the ``suffix`` proposer. The most tokens a decode gets per
    step is ``speculative.num_speculative_tokens`` (or what the draft-length
    policy allows); these options decide how many of them it uses."""

    model_config = ConfigDict(extra="forbid")

    max_match_len: int = Field(default=16, ge=1, le=256)
    """Longest suffix matched; suffixes of 1, 2, 4, ... tokens up to this are
    indexed (one index entry per level per token)."""
    max_candidates: int = Field(default=32, ge=1, le=4096)
    """Most recent occurrences of the matched suffix whose continuations are counted."""
    max_spec_factor: float = Field(default=4.0, gt=0)
    """A match of m tokens proposes at most ``max_spec_factor * m + max_spec_offset``
    tokens: longer matches are trusted with longer drafts."""
    max_spec_offset: float = Field(default=0.0, ge=0)
    """See ``max_spec_factor``."""
    min_token_prob: float = Field(default=0.1, ge=0, le=1)
    """Stop drafting where the continuation's estimated probability (the
    product, step by step, of the share of matching occurrences that continue
    with the drafted token) falls below this."""
    max_cached_requests: int = Field(default=1000, ge=0)
    """Past requests whose outputs the global cache keeps (oldest evicted first; 0 turns it off)."""
    max_cached_tokens: int = Field(default=65536, ge=1)
    """Tokens the global cache keeps in all (oldest requests evicted first):
    at most one index entry per level per token."""


@dataclass(frozen=True)
class SuffixDraft:
    """One decode's suffix draft."""

    score: float
    """Expected number of ``tokens`` accepted if the match frequencies are the
    truth (``suffix_index.vote``); 0 without a match."""
    tokens: list[int]
    match_len: int
    """Tokens of the context the match covers (0: none)."""
    parents: list[int] | None = None
    """A token tree's parents (``interfaces.tree``), None for a chain."""


@dataclass
class _RequestIndex:
    """One request's own index over its prompt + output."""

    request: RequestView
    index: SuffixIndex
    hashes: list[int]  # prefix hashes of request.token_ids indexed so far (suffix_index.extend_hashes)


class SuffixProposer(Proposer):
    """Propose, per decode, the most frequent continuation of the longest
    suffix match in the request's own text or in the global cache of past
    outputs, whichever scores higher (expected accepted tokens, from the
    frequencies; ``suffix_index.vote``).

    Each request's index follows ``request.token_ids`` (prompt + output) as
    it grows; it is built on the request's first decode and dropped by
    ``free``. When ``free`` sees a request that finished (``stop`` or
    ``length``), its output goes into the global cache, so later requests that
    produce similar text (agent loops, the same edit on many files) draft from
    it. Chunked prefill changes nothing: the proposer reads token ids, not the
    target.

    Token trees (``speculative.tree_width`` > 1): the same match proposes a
    tree of its most frequent continuations (``suffix_index.vote_tree``), at
    most ``tree_width`` children per node, ``num_speculative_tokens`` levels
    and the decode's ``num_spec_tokens`` nodes.
    """

    name = "suffix"
    api_version = "3.0"
    capabilities = ProposerCapabilities(
        needs_target_hidden_states=False,
        supports_chunked_prefill=True,
        draft_probs="one_hot",
        max_num_speculative_tokens=None,
        supports_prefix_caching=True,  # indexes request.token_ids, the whole prompt, at the first decode
        proposes_trees=True,
    )
    Options: ClassVar[type[BaseModel]] = SuffixOptions
    options: SuffixOptions

    def __init__(self, options: BaseModel, context: ProposerContext) -> None:
        super().__init__(options, context)
        o = self.options
        self.levels = match_levels(o.max_match_len)
        self.cache = SuffixCache(self.levels, o.max_cached_requests, o.max_cached_tokens)
        self._state: dict[str, _RequestIndex] = {}

    def propose(self, batch: StepBatch) -> Proposals:
        drafts = [self.scored_draft(d.request, d.num_spec_tokens) for d in batch.decodes]
        proposals = Proposals.from_lists([d.tokens for d in drafts], self.context.target.device)
        if self._tree_width() == 1:
            return proposals
        parents = [p for d in drafts for p in (d.parents if d.parents is not None else range(-1, len(d.tokens) - 1))]
        return Proposals(proposals.token_ids, proposals.cu_num_draft_tokens,
                         parents=torch.tensor(parents, dtype=torch.long, device=proposals.device))

    def _tree_width(self) -> int:
        return tree_settings(self.context)[0]

    def scored_draft(self, request: RequestView, budget: int) -> SuffixDraft:
        """The request's draft of at most ``budget`` tokens, with its score and match length."""
        return self._draft(self._sync(request), budget)

    def free(self, request_id: str) -> None:
        index = self._state.pop(request_id, None)
        if index is not None and index.request.finished and index.request.finish_reason in ("stop", "length"):
            self.cache.add(index.request.output_token_ids)

    def _sync(self, request: RequestView) -> _RequestIndex:
        """The request's index, brought up to ``request.token_ids``."""
        state = self._state.get(request.request_id)
        tokens = request.token_ids
        if state is None or state.request is not request or len(state.hashes) > len(tokens) + 1:
            state = self._state[request.request_id] = _RequestIndex(request, SuffixIndex(self.levels), [0])
        seen = len(state.hashes) - 1
        extend_hashes(state.hashes, tokens)
        state.index.add(state.hashes, seen)
        return state

    def _draft(self, state: _RequestIndex, budget: int) -> SuffixDraft:
        best = SuffixDraft(0.0, [], 0)
        if budget <= 0:
            return best
        o = self.options
        tokens = state.request.token_ids
        level, entries = state.index.lookup(state.hashes, skip_last=len(tokens))
        if level:
            streams: list[tuple[Sequence[int], int]] = [(tokens, e) for e in reversed(entries[-o.max_candidates:])]
            best = max(best, self._vote(streams, tokens, level, budget), key=_score)
        level, entries = self.cache.index.lookup(state.hashes)
        if level:
            cache = self.cache
            streams = [(cache.tokens_of(e >> POS_BITS), e & POS_MASK) for e in reversed(entries[-o.max_candidates:])]
            best = max(best, self._vote(streams, tokens, level, budget), key=_score)
        return best

    def _vote(self, streams: list[tuple[Sequence[int], int]], context: Sequence[int], level: int,
              budget: int) -> SuffixDraft:
        o = self.options
        match, streams = deepest(streams, context, level, o.max_match_len)
        limit = min(budget, int(o.max_spec_factor * match + o.max_spec_offset))
        width = self._tree_width()
        if width > 1:
            depth = min(limit, tree_settings(self.context)[1])
            tree, parents, score = vote_tree(streams, budget, width, depth, o.min_token_prob)
            return SuffixDraft(score, tree, match, parents)
        tokens, score = vote(streams, limit, o.min_token_prob)
        return SuffixDraft(score, tokens, match)


def _score(candidate: SuffixDraft) -> float:
    return candidate.score
