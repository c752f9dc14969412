"""Paged KV-cache bookkeeping: a pool of fixed-size blocks and one block table
per sequence.

Only bookkeeping lives here; the K/V tensors belong to the model runner. A
sequence's token at position p lives in slot
``table[p // block_size] * block_size + p % block_size``. Rolling back rejected
speculative tokens frees nothing: the sequence's valid length moves back and
later tokens overwrite those slots. (Prefix caching would hook in at
``allocate``: share full blocks whose token hashes match.)
"""

from __future__ import annotations

from collections import deque


class KVPoolExhausted(RuntimeError):
    """Not enough free blocks; the scheduler preempts and retries."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockManager needs num_blocks >= 1 and block_size >= 1, got "
                             f"{num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, seq_id: str, num_tokens: int) -> int:
        """Blocks to add so ``seq_id`` has slots for ``num_tokens`` positions."""
        have = len(self._tables.get(seq_id, ()))
        return max(0, self.num_blocks_for(num_tokens) - have)

    def can_allocate(self, seq_id: str, num_tokens: int) -> bool:
        return self.num_missing_blocks(seq_id, num_tokens) <= len(self._free)

    def allocate(self, seq_id: str, num_tokens: int) -> list[int]:
        """Grow ``seq_id``'s table to cover ``num_tokens`` positions."""
        missing = self.num_missing_blocks(seq_id, num_tokens)
        if missing > len(self._free):
            raise KVPoolExhausted(
                f"sequence {seq_id!r} needs {missing} more KV blocks, {len(self._free)} are free")
        table = self._tables.setdefault(seq_id, [])
        for _ in range(missing):
            table.append(self._free.popleft())
        return table

    def free(self, seq_id: str) -> None:
        for block in self._tables.pop(seq_id, ()):
            self._free.append(block)

    def block_table(self, seq_id: str) -> list[int]:
        return self._tables.get(seq_id, [])

    def has(self, seq_id: str) -> bool:
        return seq_id in self._tables
