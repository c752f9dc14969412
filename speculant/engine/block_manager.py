"""Paged KV-cache bookkeeping: a pool of fixed-size blocks, one block table
per sequence, and the prefix cache over full blocks.

Only bookkeeping lives here; the K/V tensors belong to the model runner. A
sequence's token at position p lives in slot
``table[p // block_size] * block_size + p % block_size``. Rolling back rejected
speculative tokens frees nothing: the sequence's valid length moves back and
later tokens overwrite those slots.

Prefix caching. Every block is in exactly one of three states:

- *empty*: no sequence holds it and it holds nothing worth keeping;
- *in use*: referenced by at least one sequence's table (``ref > 0``);
- *cached*: referenced by no sequence but holding a full block of committed
  K/V under its key (``block_hash``), kept for a later prompt that starts the
  same way, and evicted least recently freed first when the pool needs room.

So ``num_empty + num_cached + num_in_use == num_blocks`` always (``check``),
and ``num_free_blocks`` (what an allocation may take) is empty + cached.
The caller decides which blocks become cached (``cache_blocks``): only full
blocks whose every slot was written by committed tokens, so a block that a
speculative run wrote rejected tokens into is never keyed. A keyed block is
never written again: sequences share it only below their own write position
(``match_prefix`` + ``allocate(prefix=...)``), and ``free`` puts it back in the
cache, not the empty list, once its last holder lets go. A sequence's blocks
are freed last block first, so a sequence's tail is evicted before its head.

Placement keeps each sequence's blocks consecutive where it can, because the
reference attention reads a consecutive run as a view instead of gathering
it: a growing sequence takes the block right after its last one when that is
empty; a new sequence starts in the middle of the largest empty run, leaving
room after every sequence to grow into.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class KVPoolExhausted(RuntimeError):
    """Not enough free blocks; the scheduler preempts and retries."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockManager needs num_blocks >= 1 and block_size >= 1, got "
                             f"{num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._is_free = [True] * num_blocks  # empty blocks
        self._num_free = num_blocks
        self._ref = [0] * num_blocks
        self._key: list[bytes | None] = [None] * num_blocks
        self._by_key: dict[bytes, int] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # unreferenced keyed blocks, eviction order
        self._tables: dict[str, list[int]] = {}
        self._num_keyed: dict[str, int] = {}  # leading blocks of a table already keyed (or known unkeyable)
        self.num_evictions = 0

    # --- accounting ----------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: empty ones plus cached ones (evicted on demand)."""
        return self._num_free + len(self._cached)

    @property
    def num_empty_blocks(self) -> int:
        return self._num_free

    @property
    def num_cached_blocks(self) -> int:
        """Blocks held by no sequence, kept for their key."""
        return len(self._cached)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self._num_free - len(self._cached)

    @property
    def num_keyed_blocks(self) -> int:
        """Blocks holding a key, in use or cached."""
        return len(self._by_key)

    def check(self) -> None:
        """Assert the pool's invariants (tests call it after every step)."""
        refs = [0] * self.num_blocks
        for table in self._tables.values():
            for b in table:
                refs[b] += 1
        assert refs == self._ref, "reference counts disagree with the block tables"
        empty = sum(self._is_free)
        assert empty == self._num_free
        used = sum(1 for r in refs if r)
        assert empty + len(self._cached) + used == self.num_blocks, "empty + cached + in use != total"
        for b in range(self.num_blocks):
            assert not (self._is_free[b] and (refs[b] or self._key[b] is not None)), f"block {b} empty but held"
            assert (b in self._cached) == (not refs[b] and self._key[b] is not None), f"block {b} misfiled"
        assert all(self._key[b] == k for k, b in self._by_key.items()), "key index out of date"
        assert sum(k is not None for k in self._key) == len(self._by_key)

    # --- tables --------------------------------------------------------------
    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, seq_id: str, num_tokens: int) -> int:
        """Blocks to add so ``seq_id`` has slots for ``num_tokens`` positions."""
        have = len(self._tables.get(seq_id, ()))
        return max(0, self.num_blocks_for(num_tokens) - have)

    def _prefix_cost(self, seq_id: str, prefix: Sequence[int]) -> tuple[int, int]:
        """(blocks ``prefix`` covers, cached blocks it takes out of the free count)
        for a sequence that holds no blocks yet; (0, 0) otherwise."""
        if not prefix or seq_id in self._tables:
            return 0, 0
        return len(prefix), sum(1 for b in prefix if not self._ref[b])

    def can_allocate(self, seq_id: str, num_tokens: int, prefix: Sequence[int] = ()) -> bool:
        covered, revived = self._prefix_cost(seq_id, prefix)
        return max(0, self.num_missing_blocks(seq_id, num_tokens) - covered) <= self.num_free_blocks - revived

    def allocate(self, seq_id: str, num_tokens: int, prefix: Sequence[int] = ()) -> list[int]:
        """Grow ``seq_id``'s table to cover ``num_tokens`` positions. A new
        sequence may start with ``prefix``: cached blocks (``match_prefix``)
        it shares instead of computing."""
        covered, revived = self._prefix_cost(seq_id, prefix)
        missing = max(0, self.num_missing_blocks(seq_id, num_tokens) - covered)
        if missing > self.num_free_blocks - revived:
            raise KVPoolExhausted(f"sequence {seq_id!r} needs {missing} more KV blocks, "
                                  f"{self.num_free_blocks - revived} are free")
        if covered:
            for b in prefix:
                self._ref[b] += 1
                self._cached.pop(b, None)
            self._tables[seq_id] = list(prefix)
            self._num_keyed[seq_id] = covered
        table = self._tables.setdefault(seq_id, [])
        while self._num_free < missing:
            self._evict()
        while missing:
            nxt = table[-1] + 1 if table else None
            if nxt is None or nxt >= self.num_blocks or not self._is_free[nxt]:
                start, length = self._largest_free_run()
                nxt = start + max(0, (length - missing) // 2) if not table else start
            run = 0
            while run < missing and nxt + run < self.num_blocks and self._is_free[nxt + run]:
                self._is_free[nxt + run] = False
                self._ref[nxt + run] = 1
                table.append(nxt + run)
                run += 1
            self._num_free -= run
            missing -= run
        return table

    def _largest_free_run(self) -> tuple[int, int]:
        best_start, best_len, start = 0, 0, None
        for i, free in enumerate(self._is_free + [False]):
            if free and start is None:
                start = i
            elif not free and start is not None:
                if i - start > best_len:
                    best_start, best_len = start, i - start
                start = None
        return best_start, best_len

    def free(self, seq_id: str) -> None:
        """Release ``seq_id``'s blocks, last first: keyed ones nobody else holds
        become cached (the tail queued for eviction before the head), the others empty."""
        self._num_keyed.pop(seq_id, None)
        for block in reversed(self._tables.pop(seq_id, ())):
            self._release(block)

    def fork(self, parent_id: str, child_id: str, num_tokens: int) -> None:
        """Start ``child_id`` sharing the blocks that hold ``parent_id``'s first
        ``num_tokens`` positions (each gains a reference; ``unshare`` copies one
        before either sequence writes into it)."""
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r} already holds blocks; fork into a new sequence id")
        shared = self._tables.get(parent_id, [])[:self.num_blocks_for(num_tokens)]
        for b in shared:
            self._ref[b] += 1
        self._tables[child_id] = list(shared)

    def unshare(self, seq_id: str, start: int, end: int) -> list[tuple[int, int]]:
        """Before ``seq_id`` writes positions ``start .. end - 1``: give it a
        block of its own in place of each one there that another sequence also
        holds or that is keyed (cached content is never written), and return
        the ``(old, new)`` pairs whose K/V the caller copies."""
        table = self._tables.get(seq_id, [])
        pairs = []
        for i in range(start // self.block_size, min(len(table), self.num_blocks_for(end))):
            old = table[i]
            if self._ref[old] == 1 and self._key[old] is None:
                continue
            if self.num_free_blocks < 1:
                raise KVPoolExhausted(f"sequence {seq_id!r} needs a KV block of its own to write into "
                                      f"(block {old} is shared), and none is free")
            if not self._num_free:
                self._evict()
            new = self._is_free.index(True)
            self._is_free[new] = False
            self._num_free -= 1
            self._ref[new] = 1
            table[i] = new
            self._num_keyed[seq_id] = min(self._num_keyed.get(seq_id, 0), i)
            self._release(old)
            pairs.append((old, new))
        return pairs

    def _release(self, block: int) -> None:
        """Drop one reference to ``block``: keyed, unreferenced blocks become cached, others empty."""
        self._ref[block] -= 1
        if self._ref[block]:
            return
        if self._key[block] is not None:
            self._cached[block] = None
        else:
            self._is_free[block] = True
            self._num_free += 1

    def block_table(self, seq_id: str) -> list[int]:
        return self._tables.get(seq_id, [])

    def has(self, seq_id: str) -> bool:
        return seq_id in self._tables

    # --- prefix cache --------------------------------------------------------
    def match_prefix(self, keys: Sequence[bytes]) -> list[int]:
        """The blocks holding ``keys[0], keys[1], ...`` up to the first key not
        cached (in use by another sequence or unreferenced)."""
        blocks = []
        for key in keys:
            block = self._by_key.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def cache_blocks(self, seq_id: str, keys: Sequence[bytes], num_full: int) -> None:
        """Key ``seq_id``'s first ``num_full`` blocks with ``keys``: the caller
        vouches that each is full of committed tokens' K/V. A block whose key
        another block already holds stays unkeyed (one block per key)."""
        table = self._tables.get(seq_id)
        if table is None:
            return
        start = self._num_keyed.get(seq_id, 0)
        end = min(num_full, len(table), len(keys))
        for i in range(start, end):
            block, key = table[i], keys[i]
            if self._key[block] is None and key not in self._by_key:
                self._key[block] = key
                self._by_key[key] = block
        self._num_keyed[seq_id] = max(start, end)

    def _evict(self) -> None:
        block, _ = self._cached.popitem(last=False)
        key = self._key[block]
        assert key is not None
        del self._by_key[key]
        self._key[block] = None
        self._is_free[block] = True
        self._num_free += 1
        self.num_evictions += 1

    def evict_all(self) -> int:
        """Drop every cached block (none in use is touched); returns how many."""
        n = len(self._cached)
        while self._cached:
            self._evict()
        return n
