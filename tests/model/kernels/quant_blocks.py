"""Random GGUF weight blocks and a float64 reference for the quantized kernel tests.

Random bytes are valid codes in every block format; only the float16 scale
fields are overwritten with finite values of a realistic size. The reference
dequantizes with gguf-py (an implementation independent of ours) and quantizes
the activations as the kernel's contract says: per block of 32 (256 for K-quant
layers), scale =
max|x| / 127, codes rounded half away from zero.
"""

from __future__ import annotations

import numpy as np

# byte offsets of each format's float16 fields inside its block, and their scale
HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,)}


def random_blocks(fmt_name: str, block_elems: int, block_bytes: int, n: int, k: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``[n, k / block_elems * block_bytes]`` uint8: random codes, small finite float16 scales."""
    nblocks = k // block_elems
    raw = rng.integers(0, 256, size=(n, nblocks, block_bytes), dtype=np.uint8)
    for i, offset in enumerate(HALF_FIELDS[fmt_name]):
        sign = rng.choice([-1.0, 1.0], size=(n, nblocks)) if (fmt_name == "Q4_1" and i == 1) else 1.0
        halves = (sign * rng.uniform(0.002, 0.02, size=(n, nblocks))).astype(np.float16)
        raw[:, :, offset:offset + 2] = halves.view(np.uint8).reshape(n, nblocks, 2)
    return raw.reshape(n, nblocks * block_bytes)


def dequantize(blocks: np.ndarray, fmt_name: str, k: int) -> np.ndarray:
    """gguf-py's dequantization, as float64 ``[n, k]``."""
    import gguf

    qtype = gguf.GGMLQuantizationType[fmt_name]
    return gguf.quants.dequantize(blocks, qtype).astype(np.float64).reshape(blocks.shape[0], k)


def activation_block(block_elems: int) -> int:
    """The kernel's activation block for a layer whose weights come in blocks of ``block_elems``."""
    return 256 if block_elems == 256 else 32


def quantize_activations(x: np.ndarray, block: int) -> np.ndarray:
    """``x`` [R, K] as the kernel sees it: 8-bit codes per ``block``, back in float64."""
    rows, k = x.shape
    blocks = x.astype(np.float64).reshape(rows, k // block, block)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    scale = (amax / 127.0).astype(np.float32).astype(np.float64)
    inv = np.where(amax > 0, (127.0 / np.where(amax > 0, amax, 1)).astype(np.float32), 0).astype(np.float32)
    r = blocks.astype(np.float32) * inv
    codes = np.clip(np.trunc(r + np.where(r >= 0, 0.5, -0.5).astype(np.float32)), -127, 127)
    return (codes * scale).reshape(rows, k)
