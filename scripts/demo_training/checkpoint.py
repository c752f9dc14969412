"""Atomic training checkpoints: model, optimizer, scheduler, RNG and data position."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save(path: Path, payload: dict) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over the old one:
    a kill at any moment leaves either the previous checkpoint or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)
