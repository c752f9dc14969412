"""Suffix-decoding proposer (model-free, after SuffixDecoding, arXiv 2411.04975):
propose the most frequent continuation of the sequence's longest matching
suffix, found in the request's own prompt + output and in the outputs of past
requests, with a draft length that grows with the match and its confidence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from speculant.core.interfaces import Proposals, Proposer, ProposerCapabilities, ProposerContext
from speculant.proposers.suffix_tree import Matcher, Node, SuffixCache, SuffixTrie, greedy_continuation

if TYPE_CHECKING:
    from speculant.core.batch import StepBatch
    from speculant.core.request import Request


class SuffixOptions(BaseModel):
    """Options of the ``suffix`` proposer. The most tokens a decode gets per
    step is ``speculative.num_speculative_tokens`` (or what the draft-length
    policy allows); these options decide how many of them it uses."""

    model_config = ConfigDict(extra="forbid")

    max_tree_depth: int = Field(default=24, ge=2, le=256)
    """Longest substring the tries count: a matched pattern plus its proposed
    continuation fit in this many tokens. Costs up to this many trie nodes per token."""
    max_spec_factor: float = Field(default=1.0, gt=0)
    """A match of m tokens proposes at most ``max_spec_factor * m + max_spec_offset``
    tokens: longer matches are trusted with longer drafts."""
    max_spec_offset: float = Field(default=0.0, ge=0)
    """See ``max_spec_factor``."""
    min_token_prob: float = Field(default=0.1, ge=0, le=1)
    """Stop drafting where the continuation's estimated probability (the product
    of each step's count share among its siblings) falls below this."""
    max_cached_requests: int = Field(default=1000, ge=0)
    """Past requests whose outputs the global cache keeps (oldest evicted first; 0 turns it off)."""
    max_cached_tokens: int = Field(default=65536, ge=1)
    """Tokens the global cache keeps in all (oldest requests evicted first); its
    trie has at most ``max_tree_depth`` nodes per token, ~100 bytes each."""


@dataclass
class _RequestIndex:
    """One request's view: its own trie over prompt + output and where its
    suffix stands in the global cache."""

    request: Request
    trie: SuffixTrie
    active: list[Node]  # the request trie's nodes of the sequence's suffixes, root first
    cached: Matcher  # the same suffixes in the global cache's trie
    cache_version: int
    num_seen: int  # tokens of request.token_ids counted so far


class SuffixProposer(Proposer):
    """Propose, per decode, the greedy most-frequent continuation below the
    deepest suffix match in the request's trie or the global cache, whichever
    scores higher (expected accepted tokens, from the counts).

    Each request's trie follows ``request.token_ids`` (prompt + output) as it
    grows; it is built on the request's first decode and dropped by ``free``.
    When ``free`` sees a request that finished (``stop`` or ``length``), its
    output goes into the global cache, so later requests that produce similar
    text (agent loops, the same edit on many files) draft from it. Chunked
    prefill changes nothing: the proposer reads token ids, not the target.
    """

    name = "suffix"
    capabilities = ProposerCapabilities(
        needs_target_hidden_states=False,
        supports_chunked_prefill=True,
        draft_probs="one_hot",
        max_num_speculative_tokens=None,
    )
    Options: ClassVar[type[BaseModel]] = SuffixOptions
    options: SuffixOptions

    def __init__(self, options: BaseModel, context: ProposerContext) -> None:
        super().__init__(options, context)
        o = self.options
        self.cache = SuffixCache(o.max_tree_depth, o.max_cached_requests, o.max_cached_tokens)
        self._index: dict[str, _RequestIndex] = {}

    def propose(self, batch: StepBatch) -> Proposals:
        rows = []
        for d in batch.decodes:
            index = self._sync(d.request)
            rows.append(self._draft(index, d.num_spec_tokens))
        return Proposals.from_lists(rows, self.context.target.device)

    def free(self, request_id: str) -> None:
        index = self._index.pop(request_id, None)
        if index is not None and index.request.finished and index.request.finish_reason in ("stop", "length"):
            self.cache.add(index.request.output_token_ids)

    # --- per request --------------------------------------------------------------
    def _sync(self, request: Request) -> _RequestIndex:
        """The request's index, brought up to ``request.token_ids``."""
        index = self._index.get(request.request_id)
        tokens = request.token_ids
        if index is None or index.request is not request or index.num_seen > len(tokens):
            trie = SuffixTrie(self.options.max_tree_depth)
            index = _RequestIndex(request, trie, [trie.root], Matcher(self.cache.trie), -1, 0)
            self._index[request.request_id] = index
        new = tokens[index.num_seen:]
        trie, active = index.trie, index.active
        for token in new:
            active = trie.append(active, token)
        index.active, index.num_seen = active, len(tokens)
        if index.cache_version != self.cache.version:  # the cache changed: match the tail afresh
            index.cached = Matcher(self.cache.trie, tokens[-(self.options.max_tree_depth - 1):])
            index.cache_version = self.cache.version
        else:
            for token in new:
                index.cached.push(token)
        return index

    def _draft(self, index: _RequestIndex, budget: int) -> list[int]:
        if budget <= 0:
            return []
        best: tuple[float, list[int]] = (0.0, [])
        for nodes in (index.active, index.cached.nodes):
            for tokens, score in self._candidates(nodes, budget):
                if score > best[0]:
                    best = (score, tokens)
        return best[1]

    def _candidates(self, nodes: list[Node], budget: int):
        """Drafts from the deepest matched suffix that has a continuation and,
        when the trie's depth leaves it less room than ``budget``, from the
        deepest one that leaves room for all of it."""
        o = self.options
        depth, first = o.max_tree_depth, True
        for m in range(len(nodes) - 1, 0, -1):
            node = nodes[m]
            if not node.children:
                continue
            limit = min(budget, depth - m, int(o.max_spec_factor * m + o.max_spec_offset))
            if limit < 1:
                continue
            roomy = depth - m >= budget
            if first or roomy:
                yield greedy_continuation(node, limit, o.min_token_prob)
            first = False
            if roomy:
                return
