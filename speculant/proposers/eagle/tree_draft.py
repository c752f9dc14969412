"""EAGLE token trees (``speculative.tree_width`` > 1): the head expands its most
probable nodes level by level, the EAGLE-2 idea.

Per speculating decode, with a budget of B nodes (its ``num_spec_tokens``),
width w (``tree_width``) and depth D (``num_speculative_tokens``):

- Level 1: the head's feature after the catch-up (what gives a chain its first
  proposal) gives the distribution q of the root's children.
- A node's *score* is the head's probability of its path (the product of q
  along it). Level d + 1 expands the w highest-scoring nodes of level d: each
  runs one head entry (its token, its parent's predicted feature) at position
  ``start + d``, which sees the request's cache and the entries of its own
  ancestors only (a mask over the head's cache), and the feature it predicts
  gives the distribution of its children.
- A greedy request's node gets the w most probable tokens as children; at the
  end the request keeps its B highest-scoring nodes (a child never scores above
  its parent, so the kept set holds every kept node's ancestors). Width 1 is
  the chain the head drafts without trees.
- A sampling request's node draws its children from q without replacement,
  each node carrying q as its draft probabilities (``Proposals.probs``). The
  budget is handed out before the draws (the expanded nodes in score order,
  each up to w children) and nothing is reranked afterwards: whether a sibling
  is kept never depends on its own token, which the multi-candidate rejection
  (``sampling.tree_acceptance``) needs to keep the target's distribution.

The tree's entries sit in the head's cache after the request's true entries
and are dropped at the next catch-up (``truncate(true_len)``), as a chain's
are; ``commit`` queues the target's hidden states of the accepted path only,
so the head's cache follows the path the target kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from speculant.interfaces import Proposals
from speculant.interfaces.batch import RequestView
from speculant.proposers.eagle.model import EagleHead, SeqKV
from speculant.sampling.acceptance import verifies_by_argmax
from speculant.sampling.logits_processing import filtered_logprobs, sampling_tensors
from speculant.sampling.sampler import DRAFT_STREAM, draw_uniforms, request_generator, sample_from_probs

# features [F, H] -> (logits [F, Vd], the draft vocabulary's target ids [Vd] or None for the whole vocabulary)
DraftLogits = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass
class Node:
    token: int
    parent: int  # node index in the request's tree (-1: the decode's last token, the root)
    depth: int
    score: float  # log of the head's probability of the path
    probs: torch.Tensor | None  # [V] the distribution the node was drawn from (its parent's q); None: argmax-only
    source: int  # row of the level's features its parent predicted (the node's entry reads it)
    entry: int = -1  # index of its entry in the head cache once expanded


@dataclass
class RequestTree:
    request: RequestView
    kv: SeqKV
    position: int  # position of a depth-1 node's entry (the request's next head position)
    budget: int
    nodes: list[Node] = field(default_factory=list)
    frontier: list[int] = field(default_factory=lambda: [-1])  # nodes whose children the level draws
    true_len: int = field(init=False)  # cache entries before the tree's (the request's true entries)

    def __post_init__(self) -> None:
        self.true_len = self.kv.length

    def ancestors(self, node: int) -> list[int]:
        out = []
        while node >= 0:
            out.append(node)
            node = self.nodes[node].parent
        return out

    def room(self) -> int:
        """Nodes the request may still add: unbounded for greedy ones (reranked at the end)."""
        return 1 << 30 if self.request.params.greedy else self.budget - len(self.nodes)

    def next_frontier(self, depth: int, width: int) -> list[int]:
        level = [j for j, n in enumerate(self.nodes) if n.depth == depth]
        more = self.room() > 0 and depth < self.budget  # greedy: a node below depth budget is never kept
        self.frontier = sorted(level, key=lambda j: -self.nodes[j].score)[:width] if more else []
        return self.frontier

    def kept(self) -> tuple[list[int], list[int], list[Node]]:
        """(tokens, parents, nodes) of the proposal: greedy keeps the ``budget`` best nodes."""
        keep = list(range(len(self.nodes)))
        if self.request.params.greedy:  # ties favour the earlier node, so a parent precedes its child
            keep = sorted(sorted(keep, key=lambda j: (-self.nodes[j].score, j))[: self.budget])
        index = {j: i for i, j in enumerate(keep)}
        nodes = [self.nodes[j] for j in keep]
        return [n.token for n in nodes], [index[n.parent] if n.parent >= 0 else -1 for n in nodes], nodes


def draft_trees(head: EagleHead, embed: Callable[[torch.Tensor], torch.Tensor], draft_logits: DraftLogits,
                vocab_size: int, trees: list[RequestTree],
                feats: torch.Tensor,  # [len(trees), H] each request's feature after its catch-up
                width: int, depth: int) -> None:
    """Grow ``trees`` in place (the module docstring's scheme)."""
    for level in range(1, depth + 1):
        _add_children(trees, feats, draft_logits, vocab_size, level, width)
        if level == depth or not any([t.next_frontier(level, width) for t in trees]):  # every tree's
            return
        feats = _expand(head, embed, trees, feats, level)


def _add_children(trees: list[RequestTree], feats: torch.Tensor,  # [F, H]: frontier nodes, tree by tree
                  draft_logits: DraftLogits, vocab_size: int, level: int, width: int) -> None:
    logits, ids = draft_logits(feats)  # [F, Vd]
    requests = [t.request for t in trees for _ in t.frontier]
    probs = None
    if not verifies_by_argmax(requests):  # full-vocabulary distributions, filtered as the target's are
        full = logits.float()  # [F, V]
        if ids is not None:  # the draft vocabulary's logits at their target ids
            full = full.new_full((logits.shape[0], vocab_size), float("-inf"))
            full[:, ids] = logits.float()
        probs = filtered_logprobs(full, **sampling_tensors([r.params for r in requests], full.device)).exp()
        logp = probs.log()  # [F, V]
    else:
        logp = logits.float().log_softmax(-1)
    best_lp, best = logp.topk(min(width, logp.shape[1]), dim=-1)  # [F, w]
    if probs is None and ids is not None:
        best = ids[best]
    top_lp, top = best_lp.tolist(), best.tolist()
    row = 0
    for tree in trees:
        slots = tree.room()
        counts = [min(width, max(0, slots - width * i)) for i in range(len(tree.frontier))]
        uniforms: list[float] = []
        total: int = sum(counts)
        if total and not tree.request.params.greedy:
            gen = request_generator(tree.request, DRAFT_STREAM + level - 1)
            uniforms = draw_uniforms([gen], [total], torch.device("cpu")).tolist()
        for parent, count in zip(tree.frontier, counts):
            base = tree.nodes[parent].score if parent >= 0 else 0.0
            q = probs[row] if probs is not None else None
            if tree.request.params.greedy:
                picks = [(t, lp) for t, lp in zip(top[row], top_lp[row]) if lp > float("-inf")]
            else:
                assert q is not None, "a sampling request has its draft distribution"
                drawn = draw_distinct(q, uniforms[:count])
                uniforms = uniforms[count:]
                picks = [(t, float(logp[row, t])) for t in drawn]
            for token, lp in picks:
                tree.nodes.append(Node(token, parent, level, base + lp, q, row))
            row += 1


def draw_distinct(q: torch.Tensor,  # [V] a distribution (unnormalised)
                  uniforms: list[float]) -> list[int]:
    """Up to ``len(uniforms)`` distinct tokens drawn from ``q`` without replacement (each
    draw from q without the earlier ones); fewer when q's support runs out."""
    rest = q.double().clone()
    out: list[int] = []
    for u in uniforms:
        if not float(rest.sum()) > 0:
            break
        tok = int(sample_from_probs(rest.unsqueeze(0), torch.tensor([u], dtype=torch.float64))[0])
        out.append(tok)
        rest[tok] = 0.0
    return out


def _expand(head: EagleHead, embed: Callable[[torch.Tensor], torch.Tensor], trees: list[RequestTree],
            feats: torch.Tensor,  # [F, H] features of the level just drawn from
            level: int) -> torch.Tensor:  # [F', H] features of the new frontier nodes, tree by tree
    """One head forward: an entry per frontier node, each seeing the request's
    cache and its ancestors' entries."""
    tokens, sources, positions, segments = [], [], [], []
    visible: list[torch.Tensor | None] = []
    for tree in trees:
        if not tree.frontier:
            continue
        first = tree.kv.length
        for i, j in enumerate(tree.frontier):
            tree.nodes[j].entry = first + i
        mask = torch.zeros(len(tree.frontier), first + len(tree.frontier), dtype=torch.bool)  # [m, L]
        mask[:, : tree.true_len] = True
        for i, j in enumerate(tree.frontier):
            node = tree.nodes[j]
            tokens.append(node.token)
            sources.append(node.source)
            mask[i, [tree.nodes[a].entry for a in tree.ancestors(j)]] = True
        positions += [tree.position + level - 1] * len(tree.frontier)
        segments.append((tree.kv, len(tree.frontier)))
        visible.append(mask.to(feats.device))
    device = feats.device
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    return head.extend(embed(ids), feats[torch.tensor(sources, device=device)],
                       torch.tensor(positions, device=device), segments, visible)


def build_proposals(trees: dict[int, RequestTree], num_decodes: int, device: torch.device) -> Proposals:
    """Flat ``Proposals`` (with ``parents``, and ``probs`` where drafts were drawn
    from a distribution) for ``num_decodes`` decodes, ``trees`` by decode row."""
    rows: list[list[int]] = []
    parents: list[int] = []
    probs: list[torch.Tensor | None] = []
    for i in range(num_decodes):
        tokens, par, nodes = trees[i].kept() if i in trees else ([], [], [])
        rows.append(tokens)
        parents += par
        probs += [n.probs for n in nodes]
    out = Proposals.from_lists(rows, device)
    known = [p for p in probs if p is not None]
    stacked = torch.stack(known).to(device, torch.float32) if known and len(known) == len(probs) else None
    return Proposals(out.token_ids, out.cu_num_draft_tokens, stacked,
                     torch.tensor(parents, dtype=torch.long, device=device))
