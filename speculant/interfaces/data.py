"""What flows between the engine and its plugins in one step: the proposals,
the target's scores, the accepted tokens, and the query spans a forward is
built from. Tensors and lists in small dataclasses; no engine types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from speculant.interfaces.sequence import SequenceHandle

PLACEHOLDER_TOKEN_ID = -1


@dataclass(frozen=True)
class Proposals:
    """Proposed tokens for the decodes of one step, flat: decode i (row i of
    ``batch.decodes``) proposes ``lens[i]`` tokens (0..its num_spec_tokens),
    ``token_ids[cu_num_draft_tokens[i]:cu_num_draft_tokens[i + 1]]``.

    Every tensor lives on the target's device (``context.target.device``); the
    engine moves a plugin's output there after checking it. Nothing is padded:
    ``probs`` has one row per proposed token. Proposers that fill a padded
    ``[n, k]`` table can hand it to ``from_padded``.

    ``parents`` makes the proposals of a decode a token tree: node j of decode
    i (``token_ids[cu_num_draft_tokens[i] + j]``) follows node ``parents[...]``
    of the same decode, or the decode's last token when that is -1; parents
    come before their children and siblings propose distinct tokens
    (``interfaces.tree``). With ``probs``, node j's row is the distribution
    it was drawn from, siblings in node order and each without the tokens of
    its earlier siblings (sampling without replacement: the multi-candidate
    rejection of ``sampling.tree_acceptance`` relies on it); without, the
    drafts are one-hot. None means a chain (node j follows node j - 1). The
    engine takes trees where ``speculative.tree_width`` > 1 and the proposer
    declares ``proposes_trees``; elsewhere it refuses them (the decodes run
    without speculation and the engine logs why). ``Scores`` keep their
    layout: decode i's row ``cu_num_logits[i] + 1 + j`` is the target's logits
    after node j (and its ancestors).
    """

    token_ids: torch.Tensor  # [num_draft_tokens] long
    cu_num_draft_tokens: torch.Tensor  # [num_decodes + 1] long: 0, then running sums of lens
    probs: torch.Tensor | None = None  # [num_draft_tokens, V] float32 draft probs, or None
    parents: torch.Tensor | None = None  # [num_draft_tokens] long: parent node in the decode (-1: root); None: chain

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    @property
    def num_decodes(self) -> int:
        return self.cu_num_draft_tokens.shape[0] - 1

    @property
    def num_draft_tokens(self) -> int:
        return self.token_ids.shape[0]

    @property
    def lens(self) -> torch.Tensor:  # [num_decodes] long
        return self.cu_num_draft_tokens.diff()

    @property
    def device(self) -> torch.device:
        return self.token_ids.device

    def cu_num_logits(self) -> torch.Tensor:  # [num_decodes + 1] long
        """Offsets of each decode's ``1 + lens[i]`` rows in ``Scores.decode_logits``."""
        n = self.num_decodes
        return self.cu_num_draft_tokens + torch.arange(n + 1, device=self.cu_num_draft_tokens.device)

    @classmethod
    def empty(cls, num_decodes: int, device: torch.device | str = "cpu") -> Proposals:
        return cls(token_ids=torch.zeros(0, dtype=torch.long, device=device),
                   cu_num_draft_tokens=torch.zeros(num_decodes + 1, dtype=torch.long, device=device))

    @classmethod
    def from_lists(cls, rows: list[list[int]], device: torch.device | str = "cpu") -> Proposals:
        flat = [t for r in rows for t in r]
        if not flat:  # nothing to offer (the common n-gram step): no tensors built from lists
            return cls.empty(len(rows), device)
        lens = torch.tensor([0] + [len(r) for r in rows], dtype=torch.long)
        return cls(token_ids=torch.tensor(flat, dtype=torch.long, device=device),
                   cu_num_draft_tokens=lens.cumsum(0).to(device))

    @classmethod
    def from_padded(cls, token_ids: torch.Tensor,  # [n, k]; entries past lens[i] are ignored
                    lens: torch.Tensor,  # [n]
                    probs: torch.Tensor | None = None,  # [n, k, V] or None
                    ) -> Proposals:
        """The flat form of a padded table: one mask selects the real entries
        (row-major, so each row's proposals stay in order). Nothing is checked
        here; the engine checks every proposer's output (``proposal_checks``)."""
        keep = torch.arange(token_ids.shape[-1], device=token_ids.device) < lens.unsqueeze(-1)  # [n, k]
        cu = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
        return cls(token_ids=token_ids[keep], cu_num_draft_tokens=cu,
                   probs=probs[keep] if probs is not None else None)

    def parents_lists(self) -> list[list[int]] | None:
        """Each decode's parents as a list (None for chains)."""
        if self.parents is None:
            return None
        flat, cu = self.parents.tolist(), self.cu_num_draft_tokens.tolist()
        return [flat[a:b] for a, b in zip(cu[:-1], cu[1:])]

    def to_lists(self) -> list[list[int]]:
        """Each decode's proposals as a list (one device-to-host copy)."""
        flat, cu = self.token_ids.tolist(), self.cu_num_draft_tokens.tolist()
        return [flat[a:b] for a, b in zip(cu[:-1], cu[1:])]

    def row(self, i: int) -> list[int]:
        a, b = self.cu_num_draft_tokens[i:i + 2].tolist()
        return self.token_ids[a:b].tolist()


@dataclass(frozen=True)
class Scores:
    """Target outputs for one step, flat and on the target's device.

    ``prefill_logits`` has one row per prefill entry that reports
    (``ScheduledRequest.reports``: terminal chunks, and the chunk that ends a
    preempted request's recompute one token short), in batch order.
    ``decode_logits`` holds each decode's ``1 + lens[i]`` rows back to back,
    decode i at ``cu_num_logits[i]:cu_num_logits[i + 1]`` (no padding): row
    ``cu_num_logits[i] + j`` is the target's logits after the decode's last
    token and its first j proposals. The hidden states (final, normed) are set
    when the proposer reads them (``needs_target_hidden_states`` or
    ``needs_prompt_hidden_states``).
    """

    prefill_logits: torch.Tensor  # [num_reporting_prefills, V]
    decode_logits: torch.Tensor  # [num_decodes + num_draft_tokens, V]
    cu_num_logits: torch.Tensor  # [num_decodes + 1] long, Proposals.cu_num_logits()
    prefill_hidden: torch.Tensor | None = None  # [num_reporting_prefills, H]
    decode_hidden: torch.Tensor | None = None  # [num_decodes + num_draft_tokens, H], rows as decode_logits
    prompt_hidden: torch.Tensor | None = None  # [sum of prefill chunk lengths, H]: every chunk's rows, batch order


class AcceptedNodes(list[int]):
    """What ``Proposer.commit`` receives about acceptance, per decode (row order
    = ``batch.decodes``): as a list, the number of proposals kept (so a chain
    proposer reads ``num_accepted[i]``), and in ``nodes[i]`` the indices of the
    kept nodes, root first (for a chain, ``0 .. num_accepted[i] - 1``; for a
    tree, the accepted path through ``Proposals.parents``)."""

    def __init__(self, nodes: list[list[int]]) -> None:
        super().__init__(len(path) for path in nodes)
        self.nodes = nodes

    @classmethod
    def chain(cls, num_accepted: list[int]) -> AcceptedNodes:
        return cls([list(range(a)) for a in num_accepted])


@dataclass(frozen=True)
class AcceptedTokens:
    token_ids: torch.Tensor  # [n, max(lens) + 1] long; PLACEHOLDER_TOKEN_ID after the num_accepted + 1 emitted
    num_accepted: torch.Tensor  # [n] long, 0..lens[i]
    paths: list[list[int]] | None = None
    """For a tree: each decode's accepted nodes, root's child first (``num_accepted[i]`` of them)."""


class SpanRun:
    """What every span of query tokens has, whatever names its sequence: the
    tokens, where they start, where logits are wanted, and how they attend."""

    __slots__ = ()
    start: int
    token_ids: list[int]
    positions: list[int] | None
    ancestor_mask: list[list[bool]] | None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def token_positions(self) -> list[int]:
        return list(range(self.start, self.start + len(self.token_ids))) if self.positions is None \
            else list(self.positions)

    @property
    def is_tree(self) -> bool:
        """Whether the span carries an ancestor mask (a tree), not the causal order."""
        return self.ancestor_mask is not None

    def shape_problem(self) -> str | None:
        """Why the span's positions or ancestor mask cannot be run, or None.

        Node i sits in slot ``start + i``: its position must lie in ``start .. start + i``
        (a node is never deeper than its index), and the mask must be n x n, see the node
        itself, and see only earlier nodes (parents come before their children)."""
        name = type(self).__name__
        n = len(self.token_ids)
        if self.positions is not None:
            positions = list(self.positions)
            if len(positions) != n:
                return (f"{name}.positions has {len(positions)} entries for {n} tokens: give one position "
                        "per token, or None for the consecutive run from start")
            for i, p in enumerate(positions):
                if not self.start <= p <= self.start + i:
                    return (f"{name}.positions[{i}] = {p} lies outside {self.start}..{self.start + i} (start="
                            f"{self.start}, token {i}): a token's position is start plus its depth in the tree")
        if self.ancestor_mask is None:
            return None
        mask = self.ancestor_mask
        if len(mask) != n or any(len(row) != n for row in mask):
            return (f"{name}.ancestor_mask must be {n} x {n} for {n} tokens: row i lists which of the "
                    "span's tokens token i sees")
        for i, row in enumerate(mask):
            if not row[i]:
                return f"{name}.ancestor_mask[{i}][{i}] is false: every token sees itself; set the diagonal"
            if any(row[i + 1:]):
                return (f"{name}.ancestor_mask[{i}] sees a later token: lay the tree out parents first "
                        "(topological order), so each token sees only earlier ones")
        return None

    @property
    def end(self) -> int:
        """Context length after this span (positions < end are visible)."""
        return self.start + len(self.token_ids)


@dataclass(slots=True)
class QuerySpan(SpanRun):
    """A run of query tokens of one sequence, named by its handle.

    ``sequence`` is a ``SequenceHandle`` the same ``RunnerView`` issued (a
    proposer's own sequences, or, for a scorer, the step's
    ``ScheduledRequest.sequence``); the runner refuses any other. The tokens
    sit at ``positions`` (None: ``start .. start + len(token_ids) - 1``); they
    attend to the sequence's cached prefix (positions < start) and to each
    other as ``ancestor_mask`` says (None: causally, token i sees tokens
    0..i). Several spans may name one sequence (batch expansion): all K/V of a
    forward are written before any span attends, so a span sees the K/V its
    siblings write at lower positions.

    A tree span (a token tree under verification) lays its nodes out in
    topological order, each at the sequence's slot ``start + i`` but at
    position ``start + depth``: ``ancestor_mask[i][j]`` is true where node j
    is node i itself or one of its ancestors, so a node attends to the prefix
    and its own path only. ``shape_problem`` says why a span cannot run.
    """

    sequence: SequenceHandle
    start: int
    token_ids: list[int]
    logits_at: list[int]  # offsets inside the span whose logits are needed
    positions: list[int] | None = None  # [num_tokens] position of each token; None: start + offset
    ancestor_mask: list[list[bool]] | None = None  # [num_tokens][num_tokens]: row i sees token j; None: causal
