"""The block pool's prefix cache: keys chained over tokens, shared blocks
reference-counted, freed keyed blocks kept (cached) until the pool needs them,
evicted least recently freed first, and empty + cached + in use == total
after every operation, whatever the order of operations (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speculant.engine.block_hash import cache_salt, extend_block_hashes
from speculant.engine.block_manager import BlockManager, KVPoolExhausted

SALT = cache_salt("test-model", "float32", 4)


def keys(tokens: list[int], block_size: int = 4, salt: bytes = SALT) -> list[bytes]:
    return extend_block_hashes([], tokens, block_size, len(tokens) // block_size, salt)


def test_keys_chain_over_every_earlier_token_and_the_salt():
    a = keys(list(range(12)))
    assert len(a) == 3 and len(set(a)) == 3
    assert keys(list(range(12)) + [99, 98]) == a, "a partial last block has no key"
    b = keys([5] + list(range(1, 12)))
    assert all(x != y for x, y in zip(a, b)), "a change in block 0 changes every later key"
    c = keys(list(range(8)) + [0, 9, 10, 11])
    assert c[:2] == a[:2] and c[2] != a[2]
    assert keys(list(range(12)), salt=cache_salt("other-model", "float32", 4))[0] != a[0]
    grown = keys(list(range(4)))
    assert extend_block_hashes(grown, list(range(12)), 4, 2, SALT) == a[:2], "extends in place, up to num_blocks"


def test_freed_full_blocks_are_cached_and_shared_by_a_matching_prompt():
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = list(range(10))
    table = list(bm.allocate("a", 10))
    bm.cache_blocks("a", keys(tokens), 2)
    assert bm.num_keyed_blocks == 2 and bm.num_used_blocks == 3
    bm.free("a")
    assert (bm.num_cached_blocks, bm.num_empty_blocks, bm.num_free_blocks) == (2, 6, 8)
    bm.check()
    prefix = bm.match_prefix(keys(tokens + [1, 2]))
    assert prefix == table[:2], "only the keyed (full) blocks match"
    assert bm.can_allocate("b", 13, prefix)
    got = bm.allocate("b", 13, prefix)
    assert got[:2] == table[:2] and len(got) == 4
    assert bm.num_cached_blocks == 0 and bm.num_used_blocks == 4
    # a second holder shares them too; freeing one holder keeps them in use
    c = bm.allocate("c", 8, bm.match_prefix(keys(tokens)))
    assert c == table[:2]
    bm.free("b")
    assert bm.num_cached_blocks == 0 and bm.num_used_blocks == 2
    bm.check()
    bm.free("c")
    assert bm.num_cached_blocks == 2
    bm.check()


def test_unkeyed_blocks_go_back_empty_and_speculative_tails_are_never_cached():
    bm = BlockManager(num_blocks=6, block_size=4)
    bm.allocate("a", 11)  # 8 committed tokens + 3 slots a rejected run wrote
    bm.cache_blocks("a", keys(list(range(11))), 8 // 4)
    bm.free("a")
    assert bm.num_cached_blocks == 2 and bm.num_empty_blocks == 4


def test_eviction_is_lru_over_unreferenced_blocks_tail_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    toks = [1, 2, 3, 4, 5, 6]
    ka = keys(toks, 2)
    a = list(bm.allocate("a", 6))
    bm.cache_blocks("a", ka, 3)
    bm.free("a")
    assert bm.num_cached_blocks == 3
    bm.allocate("x", 4)  # 1 empty + 1 evicted: a's last block goes first
    assert bm.num_evictions == 1
    assert bm.match_prefix(ka) == a[:2]
    with pytest.raises(KVPoolExhausted):
        bm.allocate("y", 7)
    bm.allocate("y", 4)
    assert bm.match_prefix(ka) == [] and bm.num_evictions == 3
    bm.check()


def test_blocks_in_use_are_never_evicted_and_duplicates_stay_unkeyed():
    bm = BlockManager(num_blocks=4, block_size=2)
    k = keys([1, 2, 3, 4], 2)
    a = bm.allocate("a", 4)
    bm.cache_blocks("a", k, 2)
    b = bm.allocate("b", 4)  # the same prompt computed again, concurrently
    bm.cache_blocks("b", k, 2)
    assert bm.num_keyed_blocks == 2 and bm.match_prefix(k) == a
    with pytest.raises(KVPoolExhausted):
        bm.allocate("c", 2)
    bm.free("b")
    assert bm.num_empty_blocks == 2 and bm.num_cached_blocks == 0, "b's duplicates were never keyed"
    assert b != a
    bm.check()


def test_evict_all_drops_only_unreferenced_blocks():
    bm = BlockManager(num_blocks=4, block_size=2)
    k = keys([1, 2, 3, 4], 2)
    bm.allocate("a", 4)
    bm.cache_blocks("a", k, 2)
    bm.free("a")
    bm.allocate("b", 2, bm.match_prefix(k[:1]))
    assert bm.evict_all() == 1
    assert bm.match_prefix(k) == bm.block_table("b")
    bm.check()


ops = st.lists(st.tuples(st.sampled_from(["alloc", "grow", "cache", "free"]), st.integers(0, 4),
                         st.integers(1, 40), st.integers(0, 2)), max_size=60)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_operations_keep_the_accounting_and_the_keys_true(seq):
    """Sequences draw prompts from three families sharing prefixes; whatever
    the order, the pool's invariants hold, a matched prefix's blocks hold the
    keys asked for, and a block in use by a sequence is never handed to another
    unless it is a keyed block that both share."""
    bs = 4
    bm = BlockManager(num_blocks=12, block_size=bs)
    families = [[7] * 40, [7] * 8 + [3] * 32, list(range(40))]
    tokens: dict[str, list[int]] = {}
    for op, sid, n, fam in seq:
        name = f"s{sid}"
        if op == "alloc" and not bm.has(name):
            toks = families[fam][:n]
            prefix = bm.match_prefix(keys(toks[:max(0, n - 1)], bs))
            if bm.can_allocate(name, n, prefix):
                bm.allocate(name, n, prefix)
                tokens[name] = toks
        elif op == "grow" and bm.has(name):
            want = len(tokens[name]) + n % 9
            if bm.can_allocate(name, want):
                bm.allocate(name, want)
        elif op == "cache" and bm.has(name):
            toks = tokens[name]
            bm.cache_blocks(name, keys(toks, bs), len(toks) // bs)
        elif op == "free":
            bm.free(name)
            tokens.pop(name, None)
        bm.check()
        owners: dict[int, set[str]] = {}
        for name in tokens:
            for b in bm.block_table(name):
                owners.setdefault(b, set()).add(name)
        for b, who in owners.items():
            if len(who) > 1:
                assert bm._key[b] is not None, f"block {b} shared by {who} without a key"
    for name in list(tokens):
        bm.free(name)
    bm.check()
    assert bm.num_free_blocks == bm.num_blocks and bm.num_used_blocks == 0
