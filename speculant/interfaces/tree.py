"""Token trees: one decode's proposals as tokens with parent indices.

A decode's tree has ``n`` nodes in topological order: node j proposes
``tokens[j]`` after node ``parents[j]`` (``-1``: after the decode's last token,
the root). A chain is the tree with ``parents[j] = j - 1``. The verify span
puts the root first, so span row ``1 + j`` is node j; its position is the
decode's start plus its depth. ``TreeBuilder`` is how a proposer makes one
from candidate continuations (shared prefixes merge, the most likely first).
Plain lists: a tree is a few dozen nodes, built and walked on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def tree_settings(context: Any) -> tuple[int, int]:
    """(``speculative.tree_width``, ``num_speculative_tokens``) of a proposer's context:
    the widest node and the deepest level a tree may have; width 1 (chains) for a
    context whose config says nothing of trees."""
    spec = getattr(getattr(context, "config", None), "speculative", None)
    return getattr(spec, "tree_width", 1), getattr(spec, "num_speculative_tokens", 0)


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node: 1 for a child of the root."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def span_ancestor_mask(parents: Sequence[int]) -> list[list[bool]]:
    """The verify span's mask (``QuerySpan.ancestor_mask``), root first: row r sees
    row c where c is r itself or an ancestor of r (the root is everyone's)."""
    n = len(parents) + 1
    span_parent = [-1] + [p + 1 for p in parents]  # node j is span row j + 1; the root is row 0
    mask = [[False] * n for _ in range(n)]
    for r in range(n):
        c = r
        while c >= 0:
            mask[r][c] = True
            c = span_parent[c]
    return mask


def children(parents: Sequence[int]) -> list[list[int]]:
    """``out[0]``: the root's children; ``out[1 + j]``: node j's; each in node order."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for j, p in enumerate(parents):
        out[p + 1].append(j)
    return out


def tree_problem(tokens: Sequence[int], parents: Sequence[int]) -> str | None:
    """Why ``parents`` is not a tree over ``tokens`` (topological order, distinct
    sibling tokens), or None."""
    if len(parents) != len(tokens):
        return f"has {len(parents)} parents for {len(tokens)} tokens"
    for j, p in enumerate(parents):
        if not -1 <= p < j:
            return (f"node {j} has parent {p}, outside -1..{j - 1}: a parent comes before its child "
                    "(-1: the decode's last token)")
    for kids in children(parents):
        toks = [tokens[j] for j in kids]
        if len(set(toks)) != len(toks):
            return f"siblings {kids} repeat a token ({toks}): siblings must propose distinct tokens"
    return None


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from the root's child down to ``node`` (root first)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


class TreeBuilder:
    """Merges candidate continuations into one tree of at most ``max_nodes``
    nodes, ``max_width`` children per node and ``max_depth`` levels.

    ``add`` a continuation at a time, best first: its tokens follow the path
    already in the tree as far as they match, then branch; a branch is added
    only where the node still has room for a child, and the continuation is
    cut where the node budget or the depth runs out. So the first continuation
    is the chain a chain proposer would give, and later ones fill the budget
    with alternatives.
    """

    def __init__(self, max_nodes: int, max_width: int, max_depth: int) -> None:
        self.max_nodes, self.max_width, self.max_depth = max_nodes, max_width, max_depth
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self._kids: dict[int, dict[int, int]] = {-1: {}}  # node -> {token: child node}

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.max_nodes

    def add(self, continuation: Sequence[int]) -> None:
        node = -1
        for tok in continuation[: self.max_depth]:
            child = self._kids[node].get(tok)
            if child is None:
                if self.full or len(self._kids[node]) >= self.max_width:
                    return
                child = len(self.tokens)
                self.tokens.append(tok)
                self.parents.append(node)
                self._kids[node][tok] = child
                self._kids[child] = {}
            node = child
