"""Q4_K and Q6_K quantizers in numpy for test checkpoints (gguf-py dequantizes these
formats but has no quantizer for them). Simple round-to-nearest, no search: the
tests need valid blocks close to the weights, not llama.cpp's best rounding.
Block layouts are those of ggml (see csrc/quant.h).
"""

from __future__ import annotations

import numpy as np


def _pack_scales_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per block [nb, 8] -> the 12 packed bytes [nb, 12]."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """``w`` [n, k] (k a multiple of 256) -> Q4_K blocks [n, k / 256 * 144] uint8."""
    n, k = w.shape
    x = w.astype(np.float32).reshape(-1, 8, 32)  # [nb, sub-block, 32]
    lo = np.minimum(x.min(axis=-1), 0.0)
    hi = x.max(axis=-1)
    scale = (hi - lo) / 15.0
    d = np.maximum(scale.max(axis=-1), 1e-12) / 63.0
    dmin = np.maximum((-lo).max(axis=-1), 1e-12) / 63.0
    sc = np.clip(np.rint(scale / d[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(-lo / dmin[:, None]), 0, 63).astype(np.uint8)
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    eff_scale = d16.astype(np.float32)[:, None] * sc
    eff_min = dmin16.astype(np.float32)[:, None] * m
    safe = np.where(eff_scale > 0, eff_scale, 1.0)
    q = np.clip(np.rint((x + eff_min[..., None]) / safe[..., None]), 0, 15).astype(np.uint8)  # [nb, 8, 32]
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)  # sub-blocks 2j (low) and 2j+1 (high)
    blocks = np.concatenate([d16.view(np.uint8).reshape(-1, 2), dmin16.view(np.uint8).reshape(-1, 2),
                             _pack_scales_k4(sc, m), qs], axis=1)
    return blocks.reshape(n, k // 256 * 144)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """``w`` [n, k] (k a multiple of 256) -> Q6_K blocks [n, k / 256 * 210] uint8."""
    n, k = w.shape
    x = w.astype(np.float32).reshape(-1, 16, 16)  # [nb, group, 16]
    amax = np.abs(x).max(axis=-1)
    group_scale = amax / 31.0
    d = np.maximum(np.abs(group_scale).max(axis=-1), 1e-12) / 127.0
    d16 = d.astype(np.float16)
    sc = np.clip(np.rint(group_scale / d16.astype(np.float32)[:, None]), -128, 127).astype(np.int8)
    eff = d16.astype(np.float32)[:, None] * sc
    safe = np.where(eff != 0, eff, 1.0)
    q = (np.clip(np.rint(x / safe[..., None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    # half h, quarter j (elements 128h + 32j + l): low nibbles to ql, two high bits to qh
    ql = np.concatenate([q[:, :, 0] & 0xF | (q[:, :, 2] & 0xF) << 4,
                         q[:, :, 1] & 0xF | (q[:, :, 3] & 0xF) << 4], axis=2).reshape(-1, 128)
    qh = (q[:, :, 0] >> 4 | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), d16.view(np.uint8).reshape(-1, 2)], axis=1)
    return blocks.reshape(n, k // 256 * 210)
