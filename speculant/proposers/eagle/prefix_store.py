"""The EAGLE head's share of prefix caching: its K/V for full blocks of
committed positions, kept across requests.

The head's entry at position p reads the target's hidden state at p (which
depends on the tokens up to p) and the token at p + 1, and its K/V at p depend
on that entry alone (one layer: the keys and values are projections of its own
input). So in the block of positions ``[i * B, (i + 1) * B)`` the K/V of all
but the last position are a function of the target's key for block i
(``Request.block_hashes[i]``), and the last one also of the token after the
block. The store keeps, under the target's key, the block's K/V, the token
that followed it, and the target's hidden state at its last position: a
request continuing with the same token reuses the whole block; one continuing
with another token (a prompt sharing exactly i + 1 blocks) reuses all but the
last position and recomputes that one entry from the kept hidden state. Only
entries made from the target's real hidden states (``SeqState.true_len``)
are stored, never those the head computed from its own predicted features
while drafting.

A request the target admits after a cached prefix gets its head cache rebuilt
from the consecutive stored blocks its sequence starts with; the target then
skips only as many tokens as the head holds (``EagleProposer.restore_prefix``),
so the head never misses the hidden state of a skipped position. The store
holds at most ``capacity`` blocks, evicting the least recently used.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StoredBlock:
    k: torch.Tensor  # [B, kv_heads, D]
    v: torch.Tensor
    next_token: int  # the token after the block when it was stored (the last entry read it)
    last_hidden: torch.Tensor | None  # [H] the target's hidden state at the block's last position


@dataclass(frozen=True)
class Restored:
    k: torch.Tensor  # [n, kv_heads, D] entries for positions 0 .. n - 1
    v: torch.Tensor
    num_tokens: int  # positions covered: n, or n + 1 with ``pending``
    pending: tuple[int, torch.Tensor] | None  # (token, [H] hidden) of the last position, to recompute


class HeadKVStore:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, StoredBlock] = OrderedDict()
        self.num_evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def put(self, key: bytes, block: StoredBlock) -> None:
        if self.capacity < 1 or key in self._blocks:
            return
        self._blocks[key] = block
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
            self.num_evictions += 1

    def get(self, key: bytes) -> StoredBlock | None:
        got = self._blocks.get(key)
        if got is not None:
            self._blocks.move_to_end(key)
        return got

    def clear(self) -> None:
        self._blocks.clear()


def store_blocks(store: HeadKVStore, block_hashes: Sequence[bytes], token_ids: Sequence[int], keys: torch.Tensor,
                 values: torch.Tensor,  # [L, kv_heads, D]: the cache's true entries, positions base .. base + L - 1
                 base: int, first: int, block_size: int,
                 new_start: int, new_hidden: torch.Tensor,  # [m, H] hidden states of the entries just added
                 ) -> int:
    """Store the blocks from ``first`` on that the entries cover whole and whose
    target key is known; returns the next block to look at."""
    end = min((base + keys.shape[0]) // block_size, len(block_hashes))
    i = max(first, -(-base // block_size))
    while i < end:
        lo, last = i * block_size - base, (i + 1) * block_size - 1
        row = last - new_start
        hidden = new_hidden[row].clone() if 0 <= row < new_hidden.shape[0] else None
        store.put(block_hashes[i], StoredBlock(keys[lo: lo + block_size].clone(), values[lo: lo + block_size].clone(),
                                               token_ids[last + 1], hidden))
        i += 1
    return max(first, end)


def stored_prefix(store: HeadKVStore, block_hashes: Sequence[bytes], token_ids: Sequence[int], num_blocks: int,
                  block_size: int) -> Restored | None:
    """The head's entries for the consecutive stored blocks (at most
    ``num_blocks``) a sequence starts with; None if the first is missing."""
    ks, vs, covered, pending = [], [], 0, None
    for i in range(min(num_blocks, len(block_hashes))):
        got = store.get(block_hashes[i])
        nxt = token_ids[(i + 1) * block_size] if (i + 1) * block_size < len(token_ids) else None
        if got is None or nxt is None:
            break
        if got.next_token == nxt:
            ks.append(got.k)
            vs.append(got.v)
            covered += block_size
            continue
        if got.last_hidden is not None:  # the block's last entry read another token: recompute that one
            ks.append(got.k[:-1])
            vs.append(got.v[:-1])
            covered += block_size
            pending = (nxt, got.last_hidden)
        break  # the next block's key includes that token: it cannot match
    if not covered:
        return None
    return Restored(torch.cat(ks), torch.cat(vs), covered, pending)
