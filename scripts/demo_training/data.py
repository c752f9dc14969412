"""Packed training windows with a position that can be saved and restored.

The token stream is cut into windows of ``seq_len + 1`` tokens (inputs and
shifted labels). Each epoch uses a fresh seeded offset (so window boundaries
move between epochs) and a seeded permutation of the windows. Both are pure
functions of (seed, epoch), so the whole position is the pair (epoch, cursor):
resuming from it replays exactly the batches an uninterrupted run would see.
"""

from __future__ import annotations

import numpy as np
import torch


class PackedWindows:
    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int, vary_offset: bool = True):
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = seed
        self.vary_offset = vary_offset
        self.epoch = 0
        self.cursor = 0
        self._epoch_cache: tuple[int, np.ndarray] | None = None
        if len(tokens) < 2 * (seq_len + 1):
            raise ValueError(f"token stream of {len(tokens)} is too short for seq_len {seq_len}")

    def _starts(self, epoch: int) -> np.ndarray:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.seq_len)) if self.vary_offset else 0
            n = (len(self.tokens) - offset - 1) // self.seq_len
            starts = offset + self.seq_len * rng.permutation(n)
            self._epoch_cache = (epoch, starts)
        return self._epoch_cache[1]

    def next_batch(self, batch_size: int) -> torch.Tensor:
        rows = []
        while len(rows) < batch_size:
            starts = self._starts(self.epoch)
            if self.cursor >= len(starts):
                self.epoch, self.cursor = self.epoch + 1, 0
                continue
            s = int(starts[self.cursor])
            rows.append(self.tokens[s:s + self.seq_len + 1])
            self.cursor += 1
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    @property
    def epochs_done(self) -> float:
        return self.epoch + self.cursor / max(1, len(self._starts(self.epoch)))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "seq_len": self.seq_len,
                "n_tokens": len(self.tokens)}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "seq_len", "n_tokens"):
            mine = self.seed if key == "seed" else self.seq_len if key == "seq_len" else len(self.tokens)
            if state[key] != mine:
                raise ValueError(f"data position was saved with {key}={state[key]}, this run has {mine}")
        self.epoch, self.cursor = state["epoch"], state["cursor"]


def eval_windows(tokens: np.ndarray, seq_len: int, max_tokens: int) -> torch.Tensor:
    """Evenly spaced, non-overlapping held-out windows (fixed for the whole run)."""
    n_all = (len(tokens) - 1) // seq_len
    n = max(1, min(n_all, max_tokens // seq_len))
    idx = np.linspace(0, n_all - 1, n).round().astype(np.int64)
    return torch.from_numpy(np.stack([tokens[i * seq_len:i * seq_len + seq_len + 1] for i in idx]).astype(np.int64))
