"""The tracked tree travels: a GPU run carries the checkout plus its wheels
and model parts in at most 64 MiB, so the tracked files stay under 40 MB."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 40_000_000


def tracked_sizes() -> dict[str, int]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc})")
    names = [n for n in out.decode().split("\0") if n]
    return {n: (ROOT / n).stat().st_size for n in names if (ROOT / n).is_file()}


def test_the_tracked_tree_stays_under_the_limit():
    sizes = tracked_sizes()
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total < LIMIT_BYTES, (
        f"the tracked tree is {total / 1e6:.1f} MB, over {LIMIT_BYTES / 1e6:.0f} MB (largest: "
        + ", ".join(f"{n} {s / 1e6:.1f} MB" for n, s in largest)
        + "); keep large weights out of the repository (models/README.md)")
