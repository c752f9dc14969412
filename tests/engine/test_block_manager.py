"""BlockManager: block tables grow only at block boundaries, blocks are
exclusive to one sequence, freeing returns them, exhaustion is a clear error
that changes nothing."""

from __future__ import annotations

import pytest

from speculant.engine.block_manager import BlockManager, KVPoolExhausted


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_table_grows_only_at_block_boundaries(block_size):
    bm = BlockManager(num_blocks=64, block_size=block_size)
    previous: list[int] = []
    for num_tokens in range(1, 3 * block_size + 2):
        table = list(bm.allocate("s", num_tokens))
        assert len(table) == -(-num_tokens // block_size) == bm.num_blocks_for(num_tokens)
        assert table[: len(previous)] == previous, "existing blocks must never move"
        grew = len(table) > len(previous)
        assert grew == ((num_tokens - 1) % block_size == 0), f"grew={grew} at {num_tokens} tokens"
        previous = table
    assert bm.num_free_blocks == 64 - len(previous)


def test_allocate_is_idempotent_and_never_shrinks():
    bm = BlockManager(num_blocks=8, block_size=4)
    table = list(bm.allocate("s", 9))
    assert len(table) == 3
    assert list(bm.allocate("s", 9)) == table
    assert list(bm.allocate("s", 2)) == table  # asking for fewer tokens keeps the blocks
    assert bm.num_free_blocks == 5


def test_sequences_get_disjoint_blocks_and_free_returns_them():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = list(bm.allocate("a", 8))
    b = list(bm.allocate("b", 5))
    a += bm.allocate("a", 12)[len(a):]  # interleaved growth
    c = list(bm.allocate("c", 1))
    assert len(set(a) | set(b) | set(c)) == len(a) + len(b) + len(c) == 6
    assert all(0 <= x < 10 for x in a + b + c)
    assert bm.num_free_blocks == 4
    bm.free("b")
    assert not bm.has("b") and bm.block_table("b") == [] and bm.num_free_blocks == 6
    d = list(bm.allocate("d", 8))  # freed blocks are reusable
    assert not set(d) & (set(a) | set(c))
    bm.free("a")
    bm.free("c")
    bm.free("d")
    assert bm.num_free_blocks == 10
    bm.free("never-allocated")  # a no-op
    assert bm.num_free_blocks == 10


def test_num_missing_blocks_and_can_allocate():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.num_missing_blocks("s", 0) == 0
    assert bm.num_missing_blocks("s", 5) == 2
    bm.allocate("s", 5)
    assert bm.num_missing_blocks("s", 8) == 0
    assert bm.num_missing_blocks("s", 9) == 1
    assert bm.can_allocate("s", 16) and not bm.can_allocate("s", 17)
    assert bm.can_allocate("t", 8) and not bm.can_allocate("t", 9)


def test_exhaustion_is_an_error_that_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    bm.allocate("a", 8)
    with pytest.raises(KVPoolExhausted, match=r"'b' needs 2 more KV blocks, 1 are free"):
        bm.allocate("b", 5)
    assert isinstance(KVPoolExhausted("x"), RuntimeError)
    assert bm.num_free_blocks == 1 and not bm.has("b"), "a failed allocate must not take blocks"
    with pytest.raises(KVPoolExhausted):
        bm.allocate("a", 13)  # growing an existing table past the pool
    assert len(bm.block_table("a")) == 2 and bm.num_free_blocks == 1
    bm.allocate("b", 4)  # what does fit still works
    assert bm.num_free_blocks == 0


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (-1, 16)])
def test_invalid_pool_is_refused(num_blocks, block_size):
    with pytest.raises(ValueError, match="num_blocks >= 1 and block_size >= 1"):
        BlockManager(num_blocks, block_size)
