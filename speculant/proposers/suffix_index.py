"""The data structure of the ``suffix`` proposer (after SuffixDecoding, arXiv
2411.04975): where each recent suffix of a sequence occurred before, and the
most frequent continuation of those occurrences.

SuffixDecoding keeps suffix trees. A depth-D suffix trie in Python costs D
node updates per token (tens of microseconds), so this module keeps the part
of it the proposer reads, a *suffix index*: for each match length in
``levels`` (powers of two, 1..max_match_len) a dict from every n-gram of that
length to the positions that followed its occurrences. That is O(len(levels))
dict appends per token. A query takes the longest level at which the
sequence's suffix occurred (the deepest node a suffix-tree walk would reach,
rounded down to a level), and ``vote`` walks the continuations of its most
recent occurrences the way a walk down the tree follows the child with the
highest count: at each step the most frequent next token among the
occurrences still agreeing, with the running product of those frequencies
as the draft's confidence.

Positions are encoded as ``(serial << POS_BITS) | position`` so one index can
hold several sequences (the global cache); ``SuffixCache`` evicts its oldest
sequence by popping its entries from the front of each list.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence

POS_BITS = 32
POS_MASK = (1 << POS_BITS) - 1
HASH_MOD = (1 << 61) - 1  # a Mersenne prime: polynomial hashes of n-grams, collisions ~2**-61 per pair
HASH_BASE = 1_000_003


def match_levels(max_match_len: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``max_match_len`` (and ``max_match_len`` itself)."""
    levels = [1]
    while levels[-1] * 2 <= max_match_len:
        levels.append(levels[-1] * 2)
    if levels[-1] != max_match_len:
        levels.append(max_match_len)
    return tuple(levels)


def extend_hashes(hashes: list[int], tokens: Sequence[int]) -> None:
    """Grow ``hashes`` (prefix hashes: ``hashes[i]`` covers ``tokens[:i]``,
    ``hashes[0] == 0``) to cover all of ``tokens``. The hash of
    ``tokens[a:b]`` is then ``(hashes[b] - hashes[a] * HASH_BASE**(b - a)) % HASH_MOD``:
    one multiply per level, where hashing a tuple of the n-gram costs a copy."""
    h = hashes[-1]
    for token in tokens[len(hashes) - 1:]:
        h = (h * HASH_BASE + token + 1) % HASH_MOD
        hashes.append(h)


class SuffixIndex:
    """For each level L: the hash of every L-gram seen -> the encoded positions
    right after its occurrences, oldest first. A hash collision only ever
    costs a wrong draft (every proposal is verified), never a wrong output."""

    def __init__(self, levels: Sequence[int]) -> None:
        self.levels = tuple(levels)
        self.powers = tuple(pow(HASH_BASE, level, HASH_MOD) for level in self.levels)
        self.tables: list[dict[int, list[int]]] = [{} for _ in self.levels]
        self.num_entries = 0

    def _keys(self, hashes: list[int], end: int):
        """(table, key) of each level's n-gram ending at ``end``."""
        h = hashes[end]
        for level, power, table in zip(self.levels, self.powers, self.tables):
            if level > end:
                return
            yield table, (h - hashes[end - level] * power) % HASH_MOD

    def add(self, hashes: list[int], start: int, serial: int = 0) -> None:
        """Index the n-grams ending at positions ``start + 1 .. len(hashes) - 1``
        of the sequence whose prefix hashes are ``hashes``."""
        base = serial << POS_BITS
        levels = list(zip(self.levels, self.powers, self.tables))
        for end in range(start + 1, len(hashes)):
            h = hashes[end]
            for level, power, table in levels:  # inlined _keys: this loop is the per-token cost
                if level > end:
                    break
                key = (h - hashes[end - level] * power) % HASH_MOD
                entries = table.get(key)
                if entries is None:
                    table[key] = [base | end]
                else:
                    entries.append(base | end)
            self.num_entries += len(levels) if end >= self.levels[-1] else bisect_right(self.levels, end)

    def remove_oldest(self, hashes: list[int], serial: int) -> None:
        """Drop every entry of sequence ``serial`` (prefix hashes ``hashes``),
        which must be the oldest sequence still indexed: its entries lead each list."""
        for end in range(1, len(hashes)):
            for table, key in self._keys(hashes, end):
                entries = table[key]
                assert entries[0] >> POS_BITS == serial, "remove_oldest: not the oldest sequence"
                if len(entries) == 1:
                    del table[key]
                else:
                    del entries[0]
                self.num_entries -= 1

    def lookup(self, hashes: list[int], skip_last: int = -1) -> tuple[int, list[int]]:
        """(match length, entries) for the longest level at which the suffix of
        the context (prefix hashes ``hashes``) occurred, entries oldest first;
        ``skip_last`` is an entry to ignore when it comes last (the context's
        own end, when the context is the indexed sequence itself). (0, [])
        when nothing matches."""
        end = len(hashes) - 1
        h = hashes[end]
        for i in range(len(self.levels) - 1, -1, -1):
            level = self.levels[i]
            if level > end:
                continue
            entries = self.tables[i].get((h - hashes[end - level] * self.powers[i]) % HASH_MOD)
            if entries and entries[-1] == skip_last:
                entries = entries[:-1]
            if entries:
                return level, entries
        return 0, []


def deepest(streams: list[tuple[Sequence[int], int]], context: Sequence[int], level: int,
            max_len: int) -> tuple[int, list[tuple[Sequence[int], int]]]:
    """The occurrences of ``streams`` (each a sequence and the position after
    an occurrence of the context's last ``level`` tokens) that match the
    context furthest back, up to ``max_len`` tokens, and that match length:
    the deepest suffix-tree node the context reaches, which a level only
    bounds from below."""
    best, kept = level, []
    n = len(context)
    for seq, pos in streams:
        m = level
        while m < max_len and m < pos and m < n and seq[pos - 1 - m] == context[n - 1 - m]:
            m += 1
        if m > best:
            best, kept = m, [(seq, pos)]
        elif m == best:
            kept.append((seq, pos))
    return best, kept


def vote(streams: list[tuple[Sequence[int], int]], max_len: int, min_prob: float) -> tuple[list[int], float]:
    """The most frequent continuation of ``streams`` (each a token sequence and
    the position its continuation starts at; most recent first, which wins
    ties): at each step the token most of the still-agreeing occurrences
    continue with, while the running product of those shares stays >=
    ``min_prob``; at most ``max_len`` tokens. Returns (tokens, score), the
    score being the sum of the running products: the expected number of
    tokens accepted if the frequencies are the truth."""
    tokens: list[int] = []
    score, prob, step = 0.0, 1.0, 0
    while len(tokens) < max_len and streams:
        counts: dict[int, int] = {}
        total = 0
        for seq, pos in streams:
            if pos + step < len(seq):
                tok = seq[pos + step]
                counts[tok] = counts.get(tok, 0) + 1
                total += 1
        if not total:
            break
        best = max(counts, key=counts.__getitem__)  # first maximum: the most recent occurrence's token
        prob *= counts[best] / total
        if prob < min_prob:
            break
        tokens.append(best)
        score += prob
        streams = [(seq, pos) for seq, pos in streams if pos + step < len(seq) and seq[pos + step] == best]
        step += 1
    return tokens, score


def vote_tree(streams: list[tuple[Sequence[int], int]], max_nodes: int, max_width: int, max_depth: int,
              min_prob: float) -> tuple[list[int], list[int], float]:
    """The most frequent continuations of ``streams`` as a token tree (``interfaces.tree``):
    nodes are taken best first by their estimated probability (the running
    product of the shares of agreeing occurrences, as ``vote``'s), at most
    ``max_width`` children per node, ``max_depth`` levels and ``max_nodes`` nodes,
    none below ``min_prob``. Each node's first child is its most frequent
    continuation, so the first-child chain is ``vote``'s. Returns (tokens,
    parents, score), the score being the sum of the nodes' probabilities."""
    tokens: list[int] = []
    parents: list[int] = []
    widths: list[int] = [0]  # children so far, of the root then of each node
    score = 0.0
    order = 0  # ties: earlier candidates first (the most recent occurrence's token, as vote)
    heap: list[tuple[float, int, int, int, list[tuple[Sequence[int], int]], int]] = []

    def expand(node: int, group: list[tuple[Sequence[int], int]], prob: float, step: int) -> None:
        nonlocal order
        if step >= max_depth:
            return
        split: dict[int, list[tuple[Sequence[int], int]]] = {}
        for seq, pos in group:
            if pos + step < len(seq):
                split.setdefault(seq[pos + step], []).append((seq, pos))
        total = sum(len(g) for g in split.values())
        for tok, agreeing in split.items():
            p = prob * len(agreeing) / total
            if p >= min_prob:
                heapq.heappush(heap, (-p, order, node, tok, agreeing, step + 1))
                order += 1

    expand(-1, streams, 1.0, 0)
    while heap and len(tokens) < max_nodes:
        neg, _, parent, tok, agreeing, step = heapq.heappop(heap)
        if widths[parent + 1] >= max_width:
            continue
        widths[parent + 1] += 1
        tokens.append(tok)
        parents.append(parent)
        widths.append(0)
        score -= neg
        expand(len(tokens) - 1, agreeing, -neg, step)
    return tokens, parents, score


class SuffixCache:
    """A ``SuffixIndex`` over the outputs of past requests, oldest evicted first.

    Holds at most ``max_requests`` sequences and ``max_tokens`` tokens (a
    longer sequence keeps its first ``max_tokens``): at most
    ``len(levels) * max_tokens`` index entries.
    """

    def __init__(self, levels: Sequence[int], max_requests: int, max_tokens: int) -> None:
        self.index = SuffixIndex(levels)
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.sequences: deque[tuple[int, list[int]]] = deque()  # (serial, tokens), oldest first
        self.num_tokens = 0
        self._next_serial = 0

    def add(self, tokens: Sequence[int]) -> None:
        kept = list(tokens[:self.max_tokens])
        if not kept or self.max_requests == 0:
            return
        serial = self._next_serial
        self._next_serial += 1
        self.index.add(_hashes(kept), 0, serial)
        self.sequences.append((serial, kept))
        self.num_tokens += len(kept)
        while len(self.sequences) > self.max_requests or self.num_tokens > self.max_tokens:
            old_serial, old = self.sequences.popleft()
            self.index.remove_oldest(_hashes(old), old_serial)
            self.num_tokens -= len(old)

    def tokens_of(self, serial: int) -> list[int]:
        first = self.sequences[0][0]
        return self.sequences[serial - first][1]  # serials are consecutive, oldest first


def _hashes(tokens: Sequence[int]) -> list[int]:
    hashes = [0]
    extend_hashes(hashes, tokens)
    return hashes
