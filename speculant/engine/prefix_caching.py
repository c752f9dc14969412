"""The engine's side of prefix caching on the target's KV pool.

A request's full blocks are keyed by ``model.block_hash`` (salted with the
model, dtype and block size) and the keys kept on the request
(``Request.block_hashes``: its token ids only ever grow, so the keys of its
leading blocks never change). Two moments use them:

- **admission** (``lookup``): a request entering the running set without
  blocks (new, or preempted) looks up the cached blocks its prompt (or, after a
  preemption, its prompt + output) starts with. At most ``prefill_end - 1``
  tokens are skipped, so the chunk that ends its prefill still runs and
  samples (or, for a recompute, reports its hidden state);
- **commit** (``commit``): after a step is applied, every full block below the
  request's ``num_computed_tokens`` is keyed. Those slots were written by
  committed tokens only: proposals rejected at this step lie at or after
  ``num_computed_tokens`` and are overwritten later, so a block holding a
  rejected token is never keyed.

The scheduler charges only the uncached tokens to the step's budget; the
proposer gets a say through ``restore`` (``Proposer.restore_prefix``).
"""

from __future__ import annotations

from dataclasses import dataclass

from speculant.engine.block_hash import cache_salt, extend_block_hashes
from speculant.engine.block_manager import BlockManager
from speculant.engine.request import Request


@dataclass
class PrefixCacheStats:
    queried_tokens: int = 0  # tokens admitted requests had to prefill (prefill_end), cached or not
    hit_tokens: int = 0  # ... of which were found cached and skipped
    queried_blocks: int = 0  # full blocks they could have found cached (all but the last token)
    hit_blocks: int = 0


class PrefixCache:
    """Keys, admission lookups and commit-time keying for one pool."""

    def __init__(self, blocks: BlockManager, *salt_parts: object) -> None:
        self.blocks = blocks
        self.block_size = blocks.block_size
        self.salt = cache_salt(*salt_parts, blocks.block_size)
        self.stats = PrefixCacheStats()
        self._evictions_at_reset = 0

    def keys(self, req: Request, num_blocks: int) -> list[bytes]:
        """``req``'s block keys, computed up to ``num_blocks`` full blocks (kept on the request)."""
        return extend_block_hashes(req.block_hashes, req.token_ids, self.block_size, num_blocks, self.salt)

    def lookup(self, req: Request) -> list[int]:
        """Cached blocks ``req``'s sequence starts with, leaving at least its
        last prefill token to compute."""
        limit = max(0, req.prefill_end - 1) // self.block_size
        if limit == 0:
            return []
        return self.blocks.match_prefix(self.keys(req, limit)[:limit])

    def record(self, req: Request, hit_blocks: int) -> None:
        """Count one admission that skipped ``hit_blocks`` cached blocks."""
        s = self.stats
        s.queried_tokens += req.prefill_end
        s.hit_tokens += hit_blocks * self.block_size
        s.queried_blocks += max(0, req.prefill_end - 1) // self.block_size
        s.hit_blocks += hit_blocks

    def commit(self, req: Request) -> None:
        """Key ``req``'s full blocks of committed tokens."""
        n = min(req.num_computed_tokens, req.num_tokens) // self.block_size
        if n:
            self.blocks.cache_blocks(req.request_id, self.keys(req, n), n)

    def reset_stats(self) -> None:
        self.stats = PrefixCacheStats()
        self._evictions_at_reset = self.blocks.num_evictions

    def metrics(self) -> dict:
        s, b = self.stats, self.blocks
        return {
            "prefix_cache_hit_rate": s.hit_tokens / s.queried_tokens if s.queried_tokens else 0.0,
            "prefix_cache_block_hit_rate": s.hit_blocks / s.queried_blocks if s.queried_blocks else 0.0,
            "prefix_cache_hit_tokens": s.hit_tokens,
            "prefix_cache_queried_tokens": s.queried_tokens,
            "prefix_cache_hit_blocks": s.hit_blocks,
            "prefix_cache_queried_blocks": s.queried_blocks,
            "prefix_cache_cached_blocks": b.num_cached_blocks,
            "prefix_cache_keyed_blocks": b.num_keyed_blocks,
            "prefix_cache_evictions": b.num_evictions - self._evictions_at_reset,
        }
