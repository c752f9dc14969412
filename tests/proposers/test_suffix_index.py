"""The suffix proposer's data structure: the index against brute-force n-gram
positions, longest-match lookup, the frequency vote, removal, and the global
cache's eviction and memory bound."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from speculant.proposers.suffix_index import (
    POS_BITS,
    SuffixCache,
    SuffixIndex,
    deepest,
    extend_hashes,
    match_levels,
    vote,
)


def hashes_of(tokens) -> list[int]:
    h = [0]
    extend_hashes(h, tokens)
    return h


def brute_force(seqs: list[list[int]], levels) -> dict:
    """(level, n-gram) -> encoded positions after each occurrence, oldest first."""
    out = defaultdict(list)
    for serial, s in enumerate(seqs):
        for end in range(1, len(s) + 1):
            for level in levels:
                if level <= end:
                    out[level, tuple(s[end - level:end])].append((serial << POS_BITS) | end)
    return out


def index_contents(index: SuffixIndex, expected: dict) -> dict:
    got = {}
    for level, gram in expected:
        table = index.tables[index.levels.index(level)]
        got[level, gram] = table.get(hashes_of(gram)[-1], [])
    return got


def random_seqs(rng: random.Random, n: int, vocab: int = 4) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(rng.randint(0, 40))] for _ in range(n)]


def test_levels():
    assert match_levels(1) == (1,)
    assert match_levels(16) == (1, 2, 4, 8, 16)
    assert match_levels(12) == (1, 2, 4, 8, 12)


@pytest.mark.parametrize("seed", range(5))
def test_index_holds_every_ngram_occurrence(seed):
    rng = random.Random(seed)
    levels = match_levels(rng.choice([1, 3, 8]))
    seqs = random_seqs(rng, 3)
    index = SuffixIndex(levels)
    for serial, s in enumerate(seqs):
        h = [0]
        for cut in sorted(rng.sample(range(len(s) + 1), min(3, len(s) + 1))) + [len(s)]:  # grows in pieces
            seen = len(h) - 1
            extend_hashes(h, s[:cut])
            index.add(h, seen, serial)
    expected = brute_force(seqs, levels)
    assert index_contents(index, expected) == expected
    assert index.num_entries == sum(map(len, expected.values()))
    assert [len(t) for t in index.tables] == [sum(1 for lv, _ in expected if lv == level) for level in levels]


@pytest.mark.parametrize("seed", range(5))
def test_remove_oldest_undoes_add(seed):
    rng = random.Random(50 + seed)
    levels = match_levels(4)
    seqs = random_seqs(rng, 4)
    index = SuffixIndex(levels)
    for serial, s in enumerate(seqs):
        index.add(hashes_of(s), 0, serial)
    for serial in (0, 1):
        index.remove_oldest(hashes_of(seqs[serial]), serial)
    kept = {key: [e for e in v if e >> POS_BITS >= 2] for key, v in brute_force(seqs, levels).items()}
    expected = {key: v for key, v in kept.items() if v}
    assert index_contents(index, expected) == expected
    held = sum(len(e) for t in index.tables for e in t.values())
    assert index.num_entries == sum(map(len, expected.values())) == held
    for serial in (2, 3):
        index.remove_oldest(hashes_of(seqs[serial]), serial)
    assert index.num_entries == 0 and not any(index.tables)


def test_lookup_takes_the_longest_level_and_skips_the_context_itself():
    index = SuffixIndex(match_levels(4))
    index.add(hashes_of([1, 2, 3, 4, 9, 2, 3, 4]), 0)
    # the suffix [2, 3, 4] is not a level; [3, 4] (level 2) occurred twice
    assert index.lookup(hashes_of([7, 2, 3, 4])) == (2, [4, 8])
    assert index.lookup(hashes_of([1, 2, 3, 4])) == (4, [4])
    assert index.lookup(hashes_of([5, 6])) == (0, [])
    # the indexed sequence looked up at its own end: its last occurrence is itself
    seq = [1, 2, 3, 4, 9, 2, 3, 4]
    assert index.lookup(hashes_of(seq), skip_last=len(seq)) == (2, [4])


def test_vote_follows_the_most_frequent_continuation():
    a, b, c = [5, 6, 7], [5, 6, 8], [5, 9, 7]
    streams = [(a, 0), (b, 0), (c, 0)]  # most recent first
    # 5 (3/3), then 6 (2/3), then 7 vs 8 tie -> the most recent (a): 1/3
    tokens, score = vote(streams, max_len=5, min_prob=0.0)
    assert tokens == [5, 6, 7] and score == pytest.approx(1 + 2 / 3 + 1 / 3)
    assert vote(streams, max_len=5, min_prob=0.5)[0] == [5, 6]  # 1/3 < 0.5 stops the draft
    assert vote(streams, max_len=1, min_prob=0.0)[0] == [5]
    assert vote([([1, 2], 2)], max_len=3, min_prob=0.0) == ([], 0.0)  # nothing follows


def test_cache_evicts_oldest_requests_first():
    cache = SuffixCache(match_levels(2), max_requests=2, max_tokens=1000)
    a, b, c = [1, 2, 3], [4, 5, 6], [7, 8, 9]
    for s in (a, b, c):
        cache.add(s)
    assert [t for _, t in cache.sequences] == [b, c] and cache.num_tokens == 6
    assert cache.index.lookup(hashes_of([1, 2])) == (0, [])
    level, entries = cache.index.lookup(hashes_of([0, 4, 5]))
    assert level == 2 and [cache.tokens_of(e >> POS_BITS)[e & ((1 << POS_BITS) - 1)] for e in entries] == [6]


@pytest.mark.parametrize("seed", range(3))
def test_cache_memory_stays_bounded(seed):
    rng = random.Random(seed)
    levels, max_tokens = match_levels(8), 200
    cache = SuffixCache(levels, max_requests=1000, max_tokens=max_tokens)
    for _ in range(60):
        cache.add([rng.randrange(50) for _ in range(rng.randint(1, 80))])
        assert cache.num_tokens == sum(len(t) for _, t in cache.sequences) <= max_tokens
        assert cache.index.num_entries <= len(levels) * cache.num_tokens
    kept = [t for _, t in cache.sequences]
    first = cache.sequences[0][0]
    expected = {(lv, g): [e + (first << POS_BITS) for e in v] for (lv, g), v in brute_force(kept, levels).items()}
    assert index_contents(cache.index, expected) == expected


def test_cache_off_and_long_sequences():
    off = SuffixCache(match_levels(4), max_requests=0, max_tokens=100)
    off.add([1, 2, 3])
    assert off.index.num_entries == 0 and not off.sequences
    short = SuffixCache(match_levels(4), max_requests=10, max_tokens=3)
    short.add([1, 2, 3, 4, 5])  # keeps its first max_tokens tokens
    assert [t for _, t in short.sequences] == [[1, 2, 3]]


def test_deepest_keeps_the_occurrences_matching_furthest_back():
    a = [1, 2, 3, 9]  # occurrence of [2, 3] preceded by 1
    b = [7, 2, 3, 8]  # preceded by 7
    context = [5, 1, 2, 3]
    match, kept = deepest([(a, 3), (b, 3)], context, level=2, max_len=8)
    assert match == 3 and kept == [(a, 3)]
    match, kept = deepest([(a, 3), (b, 3)], [4, 2, 3], level=2, max_len=8)
    assert match == 2 and kept == [(a, 3), (b, 3)]  # neither extends: both kept
    assert deepest([(a, 3)], context, level=2, max_len=2) == (2, [(a, 3)])  # capped
