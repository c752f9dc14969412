"""Prompt-lookup proposer: guess the continuation by finding the sequence's own
last few tokens earlier in the prompt or output and copying what followed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from speculant.interfaces import Proposals, Proposer, ProposerCapabilities
from speculant.interfaces.tree import TreeBuilder, tree_settings

if TYPE_CHECKING:
    from speculant.interfaces.batch import StepBatch


class NgramOptions(BaseModel):
    """Options of the ``ngram`` proposer."""

    model_config = ConfigDict(extra="forbid")

    min_n: int = Field(default=1, ge=1)
    """Shortest suffix worth matching; a shorter match proposes nothing."""
    max_n: int = Field(default=3, ge=1)
    """Longest suffix tried first; longer matches are preferred."""

    @model_validator(mode="after")
    def _check_range(self) -> NgramOptions:
        if self.min_n > self.max_n:
            raise ValueError(
                f"min_n={self.min_n} is greater than max_n={self.max_n}: the proposer tries suffix "
                f"lengths from max_n down to min_n, so no length would be tried. Set min_n <= max_n "
                f"(e.g. min_n={self.max_n} or max_n={self.min_n})."
            )
        return self


class NgramProposer(Proposer):
    """Propose the tokens that followed the most recent earlier occurrence of the
    sequence's last n tokens, for the largest n in [min_n, max_n] that occurs.

    A decode budgeted ``num_spec_tokens = k`` gets up to k tokens: fewer when the
    match sits near the end of the sequence, none when nothing matches or k is 0.
    Stateless: each step reads ``request.token_ids`` (prompt + output) afresh.

    Token trees (``speculative.tree_width`` > 1): the continuations of several
    earlier matches, best first (``find_match_ends``), merged into one tree of
    at most the decode's ``num_spec_tokens`` nodes, ``tree_width`` children
    per node and ``num_speculative_tokens`` levels; its first-child chain is
    the chain this proposer gives without trees.
    """

    name = "ngram"
    api_version = "3.0"
    capabilities = ProposerCapabilities(
        needs_target_hidden_states=False,
        supports_chunked_prefill=True,
        draft_probs="one_hot",
        max_num_speculative_tokens=None,
        supports_prefix_caching=True,  # stateless: reads request.token_ids, the whole prompt
        proposes_trees=True,
    )
    Options: ClassVar[type[BaseModel]] = NgramOptions
    options: NgramOptions

    def propose(self, batch: StepBatch) -> Proposals:
        width, depth = tree_settings(self.context)
        if width > 1:
            return self._propose_trees(batch, width, depth)
        rows = [
            propose_continuation(d.request.token_ids, d.num_spec_tokens, self.options.min_n, self.options.max_n)
            for d in batch.decodes
        ]
        return Proposals.from_lists(rows, self.context.target.device)

    def _propose_trees(self, batch: StepBatch, width: int, depth: int) -> Proposals:
        rows, parents = [], []
        for d in batch.decodes:
            tree = TreeBuilder(d.num_spec_tokens, width, depth)
            tokens = d.request.token_ids
            if d.num_spec_tokens > 0:
                for end in find_match_ends(tokens, self.options.min_n, self.options.max_n, depth, 4 * width):
                    tree.add(tokens[end + 1:end + 1 + depth])
                    if tree.full:
                        break
            rows.append(tree.tokens)
            parents += tree.parents
        out = Proposals.from_lists(rows, self.context.target.device)
        return Proposals(out.token_ids, out.cu_num_draft_tokens,
                         parents=torch.tensor(parents, dtype=torch.long, device=out.device))


def propose_continuation(tokens: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``num_tokens`` tokens following the best earlier match of the suffix."""
    if num_tokens <= 0:
        return []
    end = find_match_end(tokens, min_n, max_n, num_tokens)
    return [] if end < 0 else list(tokens[end + 1:end + 1 + num_tokens])


def find_match_end(tokens: Sequence[int], min_n: int, max_n: int, want: int = 1) -> int:
    """Index of the last token of the chosen earlier occurrence of the suffix, or -1.

    Walks candidate positions from the most recent backwards (``list.index`` on a
    reversed copy, so the scan runs in C) and measures how far each one matches
    the suffix, up to ``max_n``. The best candidate has the longest match, then
    the most continuation tokens up to ``want``; among equals the most recent
    wins. (Inside a loop of period p the most recent occurrence is followed by
    only p tokens, so preferring it outright would cap proposals at p.)
    """
    ends = find_match_ends(tokens, min_n, max_n, want, 1)
    return ends[0] if ends else -1


def find_match_ends(tokens: Sequence[int], min_n: int, max_n: int, want: int, count: int) -> list[int]:
    """The ``count`` best earlier occurrences of the suffix (``find_match_end``'s order:
    longest match, then most continuation up to ``want``, then most recent), best first."""
    num = len(tokens)
    if num < 2 or count <= 0:
        return []
    limit = min(max_n, num - 1)  # the suffix itself cannot be its own earlier occurrence
    before = tokens[-2::-1]  # before[r] is tokens[num - 2 - r]
    last = tokens[-1]
    found: list[tuple[tuple[int, int], int, int]] = []  # (quality, recency rank, end)
    r = 0
    while True:
        try:
            r = before.index(last, r)
        except ValueError:
            break
        end = num - 2 - r
        length = 1
        while length < limit and end - length >= 0 and tokens[end - length] == tokens[num - 1 - length]:
            length += 1
        quality = (length, min(num - 1 - end, want))
        if length >= min_n and count > 1:
            found.append((quality, r, end))
        elif length >= min_n and (not found or quality > found[0][0]):  # one asked for: keep the best only
            found = [(quality, r, end)]
            if quality == (limit, want):
                break
        r += 1
    found.sort(key=lambda f: (-f[0][0], -f[0][1], f[1]))
    return [end for _, _, end in found[:count]]
