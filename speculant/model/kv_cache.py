"""Paged KV-cache bookkeeping: a pool of fixed-size blocks and one block table
per sequence.

Only bookkeeping lives here; the K/V tensors belong to the model runner. A
sequence's token at position p lives in slot
``table[p // block_size] * block_size + p % block_size``. Rolling back rejected
speculative tokens frees nothing: the sequence's valid length moves back and
later tokens overwrite those slots. (Prefix caching would hook in at
``allocate``: share full blocks whose token hashes match.)

Placement keeps each sequence's blocks consecutive where it can, because the
reference attention reads a consecutive run as a view instead of gathering
it: a growing sequence takes the block right after its last one when that is
free; a new sequence starts in the middle of the largest free run, leaving
room after every sequence to grow into.
"""

from __future__ import annotations


class KVPoolExhausted(RuntimeError):
    """Not enough free blocks; the scheduler preempts and retries."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockManager needs num_blocks >= 1 and block_size >= 1, got "
                             f"{num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._is_free = [True] * num_blocks
        self._num_free = num_blocks
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, seq_id: str, num_tokens: int) -> int:
        """Blocks to add so ``seq_id`` has slots for ``num_tokens`` positions."""
        have = len(self._tables.get(seq_id, ()))
        return max(0, self.num_blocks_for(num_tokens) - have)

    def can_allocate(self, seq_id: str, num_tokens: int) -> bool:
        return self.num_missing_blocks(seq_id, num_tokens) <= self._num_free

    def allocate(self, seq_id: str, num_tokens: int) -> list[int]:
        """Grow ``seq_id``'s table to cover ``num_tokens`` positions."""
        missing = self.num_missing_blocks(seq_id, num_tokens)
        if missing > self._num_free:
            raise KVPoolExhausted(
                f"sequence {seq_id!r} needs {missing} more KV blocks, {self._num_free} are free")
        table = self._tables.setdefault(seq_id, [])
        while missing:
            nxt = table[-1] + 1 if table else None
            if nxt is None or nxt >= self.num_blocks or not self._is_free[nxt]:
                start, length = self._largest_free_run()
                nxt = start + max(0, (length - missing) // 2) if not table else start
            run = 0
            while run < missing and nxt + run < self.num_blocks and self._is_free[nxt + run]:
                self._is_free[nxt + run] = False
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
        for block in self._tables.pop(seq_id, ()):
            self._is_free[block] = True
            self._num_free += 1

    def block_table(self, seq_id: str) -> list[int]:
        return self._tables.get(seq_id, [])

    def has(self, seq_id: str) -> bool:
        return seq_id in self._tables
