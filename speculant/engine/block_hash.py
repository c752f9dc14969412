"""Keys of full KV blocks for prefix caching: a hash chained over their tokens.

Block i of a sequence is keyed by ``H(key of block i - 1 || tokens of block
i)``, the chain starting from a salt that names what else decides a block's
content (the model, its dtype, the block size). So two sequences share the key
of block i exactly when they share the salt and every token up to the end of
block i: the K/V at a position depend on the tokens before it, never after.
SHA-256 (truncated to 16 bytes) rather than Python's ``hash``: a collision would
hand a request another prompt's K/V, so the key must not be forgeable.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

KEY_BYTES = 16


def cache_salt(*parts: object) -> bytes:
    """The chain's start for one model's pool: a digest of ``parts`` (model
    identity, dtype, block size, ...)."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:KEY_BYTES]


def extend_block_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int, num_blocks: int,
                        salt: bytes) -> list[bytes]:
    """Grow ``hashes`` (the keys of the leading full blocks of ``token_ids``,
    possibly none yet) in place to the first ``num_blocks`` blocks, as far as
    ``token_ids`` fills them; returns ``hashes``."""
    num_blocks = min(num_blocks, len(token_ids) // block_size)
    parent = hashes[-1] if hashes else salt
    for i in range(len(hashes), num_blocks):
        block = array("q", token_ids[i * block_size:(i + 1) * block_size]).tobytes()
        parent = hashlib.sha256(parent + block).digest()[:KEY_BYTES]
        hashes.append(parent)
    return hashes
