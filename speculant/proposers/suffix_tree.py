"""Depth-limited suffix tries with occurrence counts: the data structure of the
``suffix`` proposer (after SuffixDecoding, arXiv 2411.04975).

A ``SuffixTrie`` of depth ``D`` holds every substring of length <= D of the
sequences inserted into it, each node counting how often its substring occurs.
The children of the node for a pattern are therefore the tokens that followed
it, with their frequencies: the most frequent continuation of a pattern is a
greedy walk down from its node. A ``Matcher`` follows one growing sequence
through a trie in O(D) per token: it holds the nodes of every suffix of the
sequence (up to D - 1 tokens) that the trie contains, deepest last.

Counts are exact, so a sequence inserted can be removed again (``remove``
walks it once more, decrementing; nodes that reach 0 are unlinked): that is how
the proposer's global cache evicts old requests. Memory is bounded by the
tokens inserted: at most D nodes per token (``SuffixTrie.num_nodes`` is exact).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class Node:
    """One substring: how often it occurs and the nodes of its one-token extensions."""

    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Node] | None = None


class SuffixTrie:
    """Every substring of length <= ``max_depth`` of the inserted sequences, counted."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 2:
            raise ValueError(f"max_depth={max_depth}: a suffix trie needs depth >= 2 (a pattern plus one token)")
        self.max_depth = max_depth
        self.root = Node()
        self.num_nodes = 0

    def append(self, active: list[Node], token: int) -> list[Node]:
        """Count one more token after the suffixes in ``active`` (their nodes at
        depths 0, 1, ..., root first) and return the active list of the longer
        sequence (depths up to ``max_depth - 1``, so each can grow once more)."""
        grown = [self.root]
        for node in active:
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(token)
            if child is None:
                child = children[token] = Node()
                self.num_nodes += 1
            child.count += 1
            grown.append(child)
        if len(grown) >= self.max_depth:
            del grown[self.max_depth:]
        return grown

    def insert(self, tokens: Iterable[int]) -> list[Node]:
        """Count every substring of ``tokens``; returns the final active list."""
        active = [self.root]
        for token in tokens:
            active = self.append(active, token)
        return active

    def remove(self, tokens: Iterable[int]) -> None:
        """Undo ``insert(tokens)`` (the same tokens, inserted earlier)."""
        active = [self.root]
        for token in tokens:
            grown = [self.root]
            for node in active:
                children = node.children
                assert children is not None and token in children, "removing a sequence that was not inserted"
                child = children[token]
                child.count -= 1
                if child.count == 0:  # its whole subtree reaches 0 as the walk goes on; each node counted once
                    del children[token]
                    if not children:
                        node.children = None
                    self.num_nodes -= 1
                grown.append(child)
            del grown[self.max_depth:]
            active = grown

    def count(self, pattern: list[int]) -> int:
        """Occurrences of ``pattern`` (0 when absent or longer than the depth)."""
        node = self.root
        for token in pattern:
            child = node.children.get(token) if node.children else None
            if child is None:
                return 0
            node = child
        return node.count if pattern else 0


class Matcher:
    """The nodes of ``trie`` matching the suffixes of one growing sequence,
    root first (``nodes[m]`` is the node of the last m tokens). Read-only:
    following a sequence never changes the trie."""

    __slots__ = ("trie", "nodes")

    def __init__(self, trie: SuffixTrie, tail: Iterable[int] = ()) -> None:
        self.trie = trie
        self.nodes = [trie.root]
        for token in tail:
            self.push(token)

    def push(self, token: int) -> None:
        grown = [self.trie.root]
        for node in self.nodes:  # shortest suffix first: once one is absent, every longer one is too
            child = node.children.get(token) if node.children else None
            if child is None:
                break
            grown.append(child)
        del grown[self.trie.max_depth:]  # deepest kept: max_depth - 1, leaving room for a continuation
        self.nodes = grown


def greedy_continuation(node: Node, max_len: int, min_prob: float) -> tuple[list[int], float]:
    """The most frequent continuation below ``node``: at each level the child
    with the highest count, while the path's probability (the product of
    child count / all children's count) stays >= ``min_prob``; at most
    ``max_len`` tokens. Returns (tokens, score), the score being the sum of
    the path probabilities: the expected number of tokens accepted if the
    counts are the truth."""
    tokens: list[int] = []
    score, prob = 0.0, 1.0
    while len(tokens) < max_len and node.children:
        best_token, best, total = -1, None, 0
        for token, child in node.children.items():
            total += child.count
            if best is None or child.count > best.count:
                best_token, best = token, child
        assert best is not None
        prob *= best.count / total
        if prob < min_prob:
            break
        tokens.append(best_token)
        score += prob
        node = best
    return tokens, score


class SuffixCache:
    """A ``SuffixTrie`` over the outputs of past requests, oldest evicted first.

    Holds at most ``max_requests`` sequences and ``max_tokens`` tokens (a longer
    sequence keeps its first ``max_tokens``), so at most ``max_depth *
    max_tokens`` nodes. ``version`` changes with every insertion or eviction,
    so a ``Matcher`` following this trie knows when to rebuild.
    """

    def __init__(self, max_depth: int, max_requests: int, max_tokens: int) -> None:
        self.trie = SuffixTrie(max_depth)
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.sequences: deque[list[int]] = deque()
        self.num_tokens = 0
        self.version = 0

    def add(self, tokens: list[int]) -> None:
        tokens = list(tokens[:self.max_tokens])
        if not tokens or self.max_requests == 0:
            return
        self.trie.insert(tokens)
        self.sequences.append(tokens)
        self.num_tokens += len(tokens)
        while len(self.sequences) > self.max_requests or self.num_tokens > self.max_tokens:
            oldest = self.sequences.popleft()
            self.trie.remove(oldest)
            self.num_tokens -= len(oldest)
        self.version += 1
