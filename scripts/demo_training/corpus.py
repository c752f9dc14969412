"""The training corpus: this interpreter's own standard-library source.

Deterministic selection (sorted relative paths, fixed exclusion rules) and a
seeded split *by file* into train and held-out, so that held-out numbers are
measured on files the models never saw. The stdlib differs between Python
versions, so the manifest records the version and a hash of every file; later
stages refuse to mix data from different manifests.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Directory names anywhere in the path that are not library code proper.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
    "lib-dynload", "__phello__",
})
# Files that are data tables written by generators, machine-specific, or huge.
GENERATED_MARKER = re.compile(r"generated from|do not edit|do not change|auto-?generated", re.IGNORECASE)
MAX_FILE_BYTES = 300_000
MIN_FILE_BYTES = 64


@dataclass(frozen=True)
class CorpusFile:
    path: str          # relative to the stdlib root, posix separators
    sha256: str
    n_bytes: int
    split: str         # "train" or "heldout"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def exclusion_reason(rel: Path, text_head: str, n_bytes: int) -> str | None:
    parts = rel.parts
    if any(p in EXCLUDED_DIRS or p.startswith("config-") for p in parts[:-1]):
        return "excluded directory"
    if rel.name.startswith("_sysconfigdata"):
        return "machine-specific"
    if n_bytes > MAX_FILE_BYTES:
        return "too large"
    if n_bytes < MIN_FILE_BYTES:
        return "too small"
    if GENERATED_MARKER.search(text_head):
        return "generated"
    return None


def split_of(rel_path: str, seed: int, heldout_fraction: float) -> str:
    """Seeded, stable per-file split: adding or removing other files never moves this one."""
    h = hashlib.sha256(f"{seed}:{rel_path}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2**64
    return "heldout" if u < heldout_fraction else "train"


def select_files(root: Path, seed: int, heldout_fraction: float) -> tuple[list[CorpusFile], dict[str, int]]:
    files: list[CorpusFile] = []
    skipped: dict[str, int] = {}
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if not path.is_file() or any(p in EXCLUDED_DIRS or p.startswith("config-") for p in rel.parts[:-1]):
            continue            # not library code; not counted in "skipped"
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped["not utf-8"] = skipped.get("not utf-8", 0) + 1
            continue
        reason = exclusion_reason(rel, text[:1500], len(data))
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        rp = rel.as_posix()
        files.append(CorpusFile(rp, hashlib.sha256(data).hexdigest(), len(data),
                                split_of(rp, seed, heldout_fraction)))
    return files, skipped


def build_manifest(out: Path, seed: int, heldout_fraction: float) -> dict:
    root = stdlib_root()
    files, skipped = select_files(root, seed, heldout_fraction)
    digest = hashlib.sha256("".join(f"{f.path}:{f.sha256}:{f.split}\n" for f in files).encode()).hexdigest()
    manifest = {
        "python": sys.version.split()[0],
        "stdlib_root": str(root),
        "seed": seed,
        "heldout_fraction": heldout_fraction,
        "rules": {"excluded_dirs": sorted(EXCLUDED_DIRS) + ["config-*"],
                  "generated_marker": GENERATED_MARKER.pattern, "max_file_bytes": MAX_FILE_BYTES,
                  "min_file_bytes": MIN_FILE_BYTES},
        "skipped": skipped,
        "n_files": {s: sum(f.split == s for f in files) for s in ("train", "heldout")},
        "n_bytes": {s: sum(f.n_bytes for f in files if f.split == s) for s in ("train", "heldout")},
        "digest": digest,
        "files": [f.__dict__ for f in files],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=1))
    return manifest


def load_manifest(path: Path) -> dict:
    return json.loads(path.read_text())


def read_texts(manifest: dict, split: str) -> list[tuple[str, str]]:
    """(relative path, text) for one split, verifying that the files did not change."""
    root = Path(manifest["stdlib_root"])
    out = []
    for f in manifest["files"]:
        if f["split"] != split:
            continue
        data = (root / f["path"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise RuntimeError(f"{root / f['path']} changed since the manifest was written; "
                               "rebuild the corpus (delete the work dir's corpus/ and data/)")
        out.append((f["path"], data.decode("utf-8")))
    return out
