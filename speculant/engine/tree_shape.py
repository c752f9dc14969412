"""Adaptive token trees: each decode's tree shape from the measured verify
cost t(n)/t(1) and the acceptance each depth and branch has shown.

A node is named by its *rank path*, its rank among siblings at each level
(``(0, 0, 1)``: the second child of the first child's first child); the
first-child path is the chain a chain proposer gives (``TreeBuilder`` adds the
best continuation first).

Per request and per (depth d, rank r): decayed counts (``acceptance_decay``
per step) of rank-r children offered under a node the target reached and of
those accepted, with a prior worth two observations. The prior is the same
cell of the *pool*, one record over every request's trees (``POOL_DECAY`` per
tree): a new request starts from what the requests before it showed, rather
than from a guess it must first unlearn over its few steps (at decay 0.8 a
request's own record remembers about five). The pool's own prior is
``prior_acceptance`` at depth 1, halved per rank, and deeper the level above's
estimate (a level not reached yet inherits what shallower ones showed). The
ratio q(d, r) is the chance such a child is accepted once its parent is; a
node's gain is the product of q along its path.

Planning (``lengths``, before the proposer runs) decides who drafts and how
many nodes the scheduler reserves: the best-first tree under the table, with
nodes added across the batch by decreasing gain, the prefix that maximises
the step's expected tokens per unit of cost (``best_prefix``, the rule
``draft_length`` uses for chain positions). A flat curve buys cheap low-gain
siblings (wide trees), a steep one only high-gain first children (chains, by
themselves).

The proposer is then asked for its whole tree, and ``prune`` picks, by the
same rule, among the nodes it actually offers: a suffix or n-gram tree often
has no sibling where the plan hoped for one, and a plan of rank paths would
leave those rows unused and the first branch short. The first branch alone
(the chain) is priced too, and the tree is verified only where it is
expected to beat its own chain. ``observe`` reads the accepted path after
the step.

What a step costs outside the forward (proposer, acceptance, compaction,
Python; ``benchmarks/tree_step_profile.py``) is about a tenth of a step at
SmolLM2 bs = 1 and mostly grows with the drafts, which the cost model's
``draft_token_cost`` already prices per node.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from speculant.config.models import AdaptiveDraftLengthConfig, SpeculativeConfig
from speculant.engine.batch import StepBatch
from speculant.engine.cost_model import CostCurve, CostModel
from speculant.engine.draft_length import DraftLengthPolicy, build_draft_length_policy
from speculant.engine.request import Request
from speculant.interfaces import Proposals
from speculant.interfaces.tree import children

RankPath = tuple[int, ...]
MAX_Q = 0.99  # a child never looks as likely as its parent: best-first order puts parents first
POOL_DECAY = 0.95
"""Weight of the past in the engine-wide record per observation (each verified tree of any
request, and each step in which nobody verified one): about the last twenty trees count."""
PRIOR_WEIGHT = 2.0
"""Observations a cell's prior is worth. It does not fade with them: a cell sees few
observations (one per step at most, and only where its parent was reached), and one
lucky acceptance of a rare sibling must not make every sibling look certain."""


def rank_paths(parents: Sequence[int]) -> list[RankPath]:
    """Each node's rank path (topological order, so a parent's path is known first)."""
    kids = children(parents)
    rank = [0] * len(parents)
    for group in kids:
        for r, j in enumerate(group):
            rank[j] = r
    out: list[RankPath] = []
    for j, p in enumerate(parents):
        out.append((out[p] if p >= 0 else ()) + (rank[j],))
    return out


@dataclass
class BranchRecord:
    """One request's decayed counts per (depth - 1, rank): children offered
    under a reached node, and those accepted."""

    offered: list[list[float]]
    taken: list[list[float]]
    prior: float  # the chance a depth-1 first child is accepted, before any verify
    verified: list[int] | None = None  # parents of the tree verified this step (after ``prune``)
    pool: BranchRecord | None = None  # the engine's record over every request: this one's prior

    @classmethod
    def empty(cls, depth: int, width: int, acceptance: float, pool: BranchRecord | None = None) -> BranchRecord:
        return cls([[0.0] * width for _ in range(depth)], [[0.0] * width for _ in range(depth)], acceptance,
                   pool=pool)

    def table(self) -> list[list[float]]:
        """q[d - 1][r]: the chance a rank-r child at depth d is accepted once its parent is.
        A cell's prior is the pool's cell where the record has a pool (what every request
        showed there); otherwise the cell one level up (the depth-1 prior halves per rank),
        so a level never offered yet inherits what the shallower ones showed."""
        out: list[list[float]] = []
        m = PRIOR_WEIGHT
        shared = self.pool.table() if self.pool is not None else None
        for d, (offered, taken) in enumerate(zip(self.offered, self.taken)):
            row = []
            for r, (o, t) in enumerate(zip(offered, taken)):
                base = shared[d][r] if shared is not None else out[d - 1][r] if d else self.prior * 0.5 ** r
                row.append(min((t + m * base) / (o + m), MAX_Q))
            out.append(row)
        return out

    def drift(self, decay: float) -> None:
        """The counts fade by ``decay`` (every step: a step that verified nothing moves the
        estimates back toward the prior, the pool's, which itself fades toward
        ``prior_acceptance`` while nobody verifies, so a request held at no nodes is tried
        again once the prior would pay)."""
        for row in (*self.offered, *self.taken):
            row[:] = [decay * v for v in row]

    def q(self, depth: int, rank: int) -> float:
        return self.table()[depth - 1][rank]

    def observe(self, parents: Sequence[int], path: Sequence[int], decay: float) -> None:
        """Fold in one verified tree and its accepted path (node indices, root's child first)."""
        self.drift(decay)
        kids = children(parents)
        for d in range(min(len(path) + 1, len(self.offered))):
            group = kids[path[d - 1] + 1 if d else 0]  # the children of the node reached at this level
            for r, j in enumerate(group[: len(self.offered[d])]):
                self.offered[d][r] += 1.0
                self.taken[d][r] += d < len(path) and path[d] == j


def best_first(record: BranchRecord, limit: int, width: int, depth: int) -> list[tuple[float, RankPath]]:
    """Up to ``limit`` nodes of the tree that maximises expected accepted tokens
    for its size: (gain, rank path), gains non-increasing, parents before children."""
    q = record.table()
    out: list[tuple[float, RankPath]] = []
    heap: list[tuple[float, RankPath]] = [(-q[0][0], (0,))]
    while heap and len(out) < limit:
        neg, path = heapq.heappop(heap)
        out.append((-neg, path))
        d, r = len(path), path[-1]
        if d < depth:
            heapq.heappush(heap, (neg * q[d][0], path + (0,)))
        if r + 1 < width:
            heapq.heappush(heap, (neg / q[d - 1][r] * q[d - 1][r + 1], path[:-1] + (r + 1,)))
    return out



def node_gains(q: Sequence[Sequence[float]], parents: Sequence[int]) -> tuple[list[float], list[RankPath]]:
    """Each node's gain (the product of q along its rank path; 0 outside the table)
    and its rank path, for an offered tree (topological order)."""
    paths = rank_paths(parents)
    gains: list[float] = []
    for p, path in zip(parents, paths):
        d, r = len(path), path[-1]
        cell = q[d - 1][r] if d <= len(q) and r < len(q[d - 1]) else 0.0
        gains.append((gains[p] if p >= 0 else 1.0) * cell)
    return gains, paths


def best_prefix(gains: Sequence[float], rows: int, gain: float, drafts: int, cost: CostModel) -> tuple[int, float]:
    """How many of ``gains`` (non-increasing) to add to a step of ``rows`` forward rows
    that expects ``gain`` tokens from ``drafts`` drafted nodes: the prefix that maximises
    expected tokens per unit of cost (t(rows)/t(1) plus ``draft_token_cost`` per node).
    A node that does not pay alone is taken when the ones after it make the whole worth
    more (a flat stretch of the curve, nearly sure nodes behind a doubtful one).
    Returns (that length, its ratio)."""
    curve, d = cost.curve, cost.draft_token_cost
    base = curve.cost(rows) + d * drafts
    best, best_ratio, total = 0, gain / base if base > 0 else 0.0, gain
    for n, g in enumerate(gains, 1):
        if total + g * (len(gains) - n + 1) <= best_ratio * (curve.cost(rows + n - 1) + d * (drafts + n - 1)):
            break  # even if every remaining node were this good and free, no longer prefix could win
        total += g
        ratio = total / (curve.cost(rows + n) + d * (drafts + n))
        if ratio > best_ratio:
            best, best_ratio = n, ratio
    return best, best_ratio

class AdaptiveTreeShapes(DraftLengthPolicy):
    """Tree shape per request from the cost curve and branch acceptance (module docstring)."""

    name = "adaptive"

    def __init__(self, spec: SpeculativeConfig, cost: CostModel | None = None) -> None:
        super().__init__(spec)
        assert isinstance(spec.draft_length, AdaptiveDraftLengthConfig)
        self.config = spec.draft_length
        self.width, self.depth = spec.tree_width, spec.num_speculative_tokens
        self.cost = cost if cost is not None else CostModel(
            CostCurve.linear(self.config.token_cost if self.config.token_cost is not None else 0.05),
            self.config.draft_token_cost if self.config.draft_token_cost is not None else 0.0)
        self._records: dict[str, BranchRecord] = {}
        self.pool = BranchRecord.empty(self.depth, self.width, self.config.prior_acceptance)  # every request's
        self.shapes: dict[str, frozenset[RankPath]] = {}  # this step's plan, per request

    def reset_metrics(self) -> None:
        super().reset_metrics()
        self.num_planned_nodes = 0  # nodes of the planned shapes, summed
        self.num_planned_trees = 0  # shapes planned with at least one node
        self.num_planned_branching = 0  # of them, shapes wider than a chain
        self.num_verified_nodes = 0  # nodes ``prune`` kept of the offered trees, summed
        self.num_verified_trees = 0  # trees it kept at least one node of
        self.num_verified_branching = 0  # of them, trees wider than a chain

    def record(self, request_id: str) -> BranchRecord:
        rec = self._records.get(request_id)
        if rec is None:
            rec = self._records[request_id] = BranchRecord.empty(self.depth, self.width, self.config.prior_acceptance,
                                                                 self.pool)
        return rec

    def lengths(self, decoding: list[Request], ceilings: dict[str, int], fixed: dict[str, int],
                fixed_requests: Sequence[Request] = ()) -> dict[str, int]:
        rows = len(decoding) + len(fixed) + sum(fixed.values())  # the forward's rows before any planned node
        gain = float(len(decoding) + len(fixed)) + sum(
            g for r in fixed_requests
            for g, _ in best_first(self.record(r.request_id), fixed[r.request_id], self.width, self.depth))
        candidates = [(g, i, path) for i, r in enumerate(decoding)
                      for g, path in best_first(self.record(r.request_id), ceilings[r.request_id], self.width,
                                                self.depth)]
        candidates.sort(key=lambda c: -c[0])  # stable: a request's parents stay before its children
        n, _ = best_prefix([c[0] for c in candidates], rows, gain, sum(fixed.values()), self.cost)
        chosen: dict[str, list[RankPath]] = {r.request_id: [] for r in decoding}
        for _, i, path in candidates[:n]:
            chosen[decoding[i].request_id].append(path)
        self.shapes = {rid: frozenset(paths) for rid, paths in chosen.items()}
        for paths in chosen.values():
            if paths:
                self.num_planned_trees += 1
                self.num_planned_nodes += len(paths)
                self.num_planned_branching += any(p[-1] > 0 for p in paths)
        # the proposer gets its whole budget; ``prune`` picks the nodes that pay from the tree it offers
        return {rid: ceilings[rid] if chosen[rid] else 0 for rid in chosen}

    def prune(self, batch: StepBatch, proposals: Proposals) -> Proposals:
        """``proposals`` with each planned decode's tree cut to the nodes that pay
        (``choose``); decodes without a plan, whose drafts are fixed, keep theirs."""
        rows = proposals.to_lists()
        parents = proposals.parents_lists() or [list(range(-1, len(r) - 1)) for r in rows]
        planned = [self.shapes.get(e.request.request_id) is not None for e in batch.decodes]
        kept = self.choose(batch, parents, planned)
        cu = proposals.cu_num_draft_tokens.tolist()
        flat_kept: list[int] = []  # indices into proposals.token_ids (and probs) of the nodes kept
        lens, keep_parents = [], []
        for i, (nodes, par) in enumerate(zip(kept, parents)):
            index = {j: n for n, j in enumerate(nodes)}  # nodes are closed under parents (``choose``)
            keep_parents += [index[par[j]] if par[j] >= 0 else -1 for j in nodes]
            flat_kept += [cu[i] + j for j in nodes]
            lens.append(len(nodes))
            if planned[i] and nodes:
                self.num_verified_trees += 1
                self.num_verified_nodes += len(nodes)
                self.num_verified_branching += len(nodes) > len({par[j] for j in nodes})
        device = proposals.device
        at = torch.tensor(flat_kept, dtype=torch.long, device=device)
        return Proposals(proposals.token_ids[at], torch.tensor([0] + lens, dtype=torch.long, device=device).cumsum(0),
                         proposals.probs[at] if proposals.probs is not None else None,
                         torch.tensor(keep_parents, dtype=torch.long, device=device))

    def choose(self, batch: StepBatch, parents: Sequence[Sequence[int]], planned: Sequence[bool]) -> list[list[int]]:
        """Per decode, the nodes of its offered tree to verify (ascending, closed under parents).

        Each node's gain is the product of q along its rank path in the offered tree;
        across the planned decodes nodes are taken by decreasing gain, the prefix that
        maximises the step's expected tokens per unit of cost (``best_prefix``). The
        same rule over first children alone gives the chain a chain policy would
        verify; the tree is kept only where it is expected to beat that chain, so a
        tree never plans worse than its own first branch."""
        rows, gain = len(batch.decodes), float(len(batch.decodes))
        drafts = 0
        every: list[tuple[float, int, int]] = []  # (gain, decode, node), node order within a decode
        chain: list[tuple[float, int, int]] = []
        out: list[list[int]] = []
        for i, (entry, par) in enumerate(zip(batch.decodes, parents)):
            gains, paths = node_gains(self.record(entry.request.request_id).table(), par)
            if not planned[i]:  # fixed drafts: verified whole, priced first
                out.append(list(range(len(par))))
                rows, drafts, gain = rows + len(par), drafts + len(par), gain + sum(gains)
                continue
            out.append([])
            for j, (g, path) in enumerate(zip(gains, paths)):
                every.append((g, i, j))
                if not any(path):
                    chain.append((g, i, j))
        best: tuple[float, list[tuple[float, int, int]]] = (-1.0, [])
        for cands in (chain, every):  # the chain first: a tree must beat it, not tie
            cands.sort(key=lambda c: -c[0])  # stable: parents before children (a child's gain is lower)
            n, ratio = best_prefix([c[0] for c in cands], rows, gain, drafts, self.cost)
            if ratio > best[0]:
                best = (ratio, cands[:n])
        for _, i, j in best[1]:
            out[i].append(j)
        return [sorted(nodes) for nodes in out]

    def verified(self, batch: StepBatch, proposals: Proposals) -> None:
        """Note the trees the target verifies this step (after ``prune`` and any cut to chains)."""
        rows = proposals.to_lists()
        parents = proposals.parents_lists() or [list(range(-1, len(r) - 1)) for r in rows]
        for entry, par in zip(batch.decodes, parents):
            if entry.request.request_id in self.shapes:
                self.record(entry.request.request_id).verified = par

    def observe(self, batch: StepBatch, paths: Sequence[Sequence[int]] | None) -> None:
        """Fold in each decode's accepted path (None: the step was not verified as planned)."""
        decay = self.config.acceptance_decay
        pooled = False
        for i, entry in enumerate(batch.decodes):
            rec = self._records.get(entry.request.request_id)
            if rec is None:
                continue
            if rec.verified:
                if paths is not None:
                    rec.observe(rec.verified, paths[i], decay)
                    self.pool.observe(rec.verified, paths[i], POOL_DECAY)
                    pooled = True
            elif entry.request.request_id in self.shapes:  # planned, but nothing was verified
                rec.drift(decay)
            rec.verified = None
        if not pooled and any(e.request.request_id in self.shapes for e in batch.decodes):
            self.pool.drift(POOL_DECAY)  # nobody verified: the pool, too, fades back toward the prior

    def free(self, request_id: str) -> None:
        self._records.pop(request_id, None)
        self.shapes.pop(request_id, None)

    def metrics(self) -> dict:
        n = self.num_planned_trees
        v = self.num_verified_trees
        return {**super().metrics(), "tree_policy": "adaptive_shape",
                "mean_planned_tree_nodes": self.num_planned_nodes / n if n else 0.0,
                "planned_branching_fraction": self.num_planned_branching / n if n else 0.0,
                "mean_verified_tree_nodes": self.num_verified_nodes / v if v else 0.0,
                "verified_branching_fraction": self.num_verified_branching / v if v else 0.0}


def build_policy(spec: SpeculativeConfig, cost: CostModel | None = None) -> DraftLengthPolicy:
    """The configured draft-length policy; with token trees, the adaptive one plans tree shapes."""
    if spec.trees and spec.draft_length.policy == "adaptive":
        return AdaptiveTreeShapes(spec, cost)
    return build_draft_length_policy(spec, cost)
