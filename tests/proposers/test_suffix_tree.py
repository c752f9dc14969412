"""The suffix proposer's data structure: substring counts against a brute-force
count, matches, the greedy most-frequent continuation, removal, the global
cache's eviction and memory bound."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from speculant.proposers.suffix_tree import Matcher, SuffixCache, SuffixTrie, greedy_continuation


def substring_counts(seqs: list[list[int]], depth: int) -> Counter:
    counts: Counter = Counter()
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + depth) + 1):
                counts[tuple(s[i:j])] += 1
    return counts


def trie_counts(trie: SuffixTrie) -> Counter:
    out: Counter = Counter()
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for tok, child in (node.children or {}).items():
            out[path + (tok,)] = child.count
            stack.append((path + (tok,), child))
    return out


def random_seqs(rng: random.Random, n: int, vocab: int = 5) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(rng.randint(0, 30))] for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_counts_equal_brute_force(seed):
    rng = random.Random(seed)
    depth = rng.randint(2, 6)
    seqs = random_seqs(rng, 4)
    trie = SuffixTrie(depth)
    for s in seqs:
        trie.insert(s)
    expected = substring_counts(seqs, depth)
    assert trie_counts(trie) == expected
    assert trie.num_nodes == len(expected)
    for pattern in list(expected)[:20]:
        assert trie.count(list(pattern)) == expected[pattern]
    assert trie.count([99]) == 0


@pytest.mark.parametrize("seed", range(6))
def test_remove_undoes_insert(seed):
    rng = random.Random(100 + seed)
    depth = rng.randint(2, 6)
    seqs = random_seqs(rng, 5)
    trie = SuffixTrie(depth)
    for s in seqs:
        trie.insert(s)
    for s in seqs[:3]:
        trie.remove(s)
    expected = substring_counts(seqs[3:], depth)
    assert trie_counts(trie) == expected  # no node left at count 0
    assert trie.num_nodes == len(expected)
    for s in seqs[3:]:
        trie.remove(s)
    assert trie.num_nodes == 0 and trie.root.children is None


def test_matcher_finds_every_matching_suffix():
    trie = SuffixTrie(5)
    trie.insert([1, 2, 3, 4, 5, 6])
    m = Matcher(trie, [9, 9, 2, 3, 4])
    # suffixes [4], [3, 4], [2, 3, 4] occur; [9, 2, 3, 4] does not
    assert len(m.nodes) == 4 and m.nodes[3] is trie.root.children[2].children[3].children[4]
    m.push(5)  # [2, 3, 4, 5] matches; max_depth - 1 = 4 is the deepest kept
    assert len(m.nodes) == 5
    m.push(6)  # [3, 4, 5, 6] still matches, at the depth limit
    assert [len(m.nodes), m.nodes[-1].count] == [5, 1]
    m.push(7)
    assert m.nodes == [trie.root]


def test_greedy_continuation_follows_the_most_frequent_path():
    trie = SuffixTrie(6)
    for s in ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4], [1, 7]):
        trie.insert(s)
    node = trie.root.children[1]
    # after 1: 2 (3 of 4), then 3 (3/3), then 4 (2/3): path probabilities 0.75, 0.75, 0.5
    tokens, score = greedy_continuation(node, 5, min_prob=0.0)
    assert tokens == [2, 3, 4] and score == pytest.approx(0.75 + 0.75 + 0.5)
    assert greedy_continuation(node, 5, min_prob=0.6)[0] == [2, 3]  # 0.5 < 0.6 stops the draft
    assert greedy_continuation(node, 1, min_prob=0.0)[0] == [2]


def test_cache_evicts_oldest_requests_first():
    cache = SuffixCache(max_depth=4, max_requests=2, max_tokens=1000)
    a, b, c = [1, 2, 3], [4, 5, 6], [7, 8, 9]
    for s in (a, b, c):
        cache.add(s)
    assert cache.trie.count([1]) == 0 and cache.trie.count([4, 5]) == 1 and cache.trie.count([7, 8, 9]) == 1
    assert trie_counts(cache.trie) == substring_counts([b, c], 4)
    assert list(cache.sequences) == [b, c] and cache.num_tokens == 6


@pytest.mark.parametrize("seed", range(3))
def test_cache_memory_stays_bounded(seed):
    rng = random.Random(seed)
    depth, max_tokens = 8, 200
    cache = SuffixCache(max_depth=depth, max_requests=1000, max_tokens=max_tokens)
    peak = 0
    for _ in range(100):
        cache.add([rng.randrange(50) for _ in range(rng.randint(1, 80))])
        assert cache.num_tokens <= max_tokens
        assert cache.num_tokens == sum(len(s) for s in cache.sequences)
        assert cache.trie.num_nodes <= depth * cache.num_tokens
        peak = max(peak, cache.trie.num_nodes)
    assert trie_counts(cache.trie) == substring_counts(list(cache.sequences), depth)
    assert peak <= depth * max_tokens


def test_cache_off_and_long_sequences():
    off = SuffixCache(max_depth=4, max_requests=0, max_tokens=100)
    off.add([1, 2, 3])
    assert off.trie.num_nodes == 0 and off.version == 0
    short = SuffixCache(max_depth=4, max_requests=10, max_tokens=3)
    short.add([1, 2, 3, 4, 5])  # keeps its first max_tokens tokens
    assert list(short.sequences) == [[1, 2, 3]] and short.trie.count([3, 4]) == 0


def test_depth_below_two_is_refused():
    with pytest.raises(ValueError, match="max_depth=1: a suffix trie needs depth >= 2"):
        SuffixTrie(1)
