"""Resolve a configured model source to a local Hugging Face directory.

A plain directory is returned as it is. A GGUF checkpoint (``model.path`` = a
``.gguf`` file, or a directory plus ``model.gguf_file``) is converted once by
``gguf_convert`` (transformers' GGUF support, every tensor dequantized into the
configured dtype; ``pip install 'speculant[gguf]'``) into an ordinary model
directory: safetensors, config, generation config and tokenizer files with the
chat template. The engine then loads that
directory through the normal path, so the load-time probe and self-test apply
unchanged.

The copy is cached in ``<cache root>/gguf/<sha256[:16]>-<dtype>/``, the cache
root being the one of the compiled kernel (``$SPECULANT_CACHE_DIR``, else
``$XDG_CACHE_HOME/speculant``, else ``~/.cache/speculant``) under the same
trust rule: every folder on the way must be a real directory owned by this
user and not writable by group or others, else the conversion goes into a
private temporary directory removed at exit (and is redone by the next
process). An entry is built in a temporary folder next to it and renamed into
place, so a crash never leaves a half-written entry under the trusted name; it
is used only when its marker file (``speculant-gguf.json``) records this
file's SHA-256, the dtype and the transformers version that converted it, and
every file it lists is there with its recorded size. The marker also records
each source file's (path, size, mtime, inode): an unchanged file finds its
entry without being hashed again.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from speculant.model.kernels.build import _write_atomic, cache_root, untrusted_reason
from speculant.model.loading.gguf_convert import check_magic, convert, converter_version, require_gguf_support

logger = logging.getLogger(__name__)

MARKER = "speculant-gguf.json"
FORMAT = 1
MAX_SOURCES = 8  # (path, size, mtime, inode) signatures kept per entry
_private: dict[tuple[str, str], Path] = {}  # (digest, dtype) -> conversion in a private temp dir


def resolve_model_source(path: str, gguf_file: str | None, dtype: str, option: str = "model.path",
                         file_option: str = "model.gguf_file") -> str:
    """The Hugging Face directory to load for this source: ``path`` itself, or
    the cached conversion of the GGUF checkpoint it names."""
    source = gguf_source_file(path, gguf_file, option, file_option)
    if source is None:
        return path
    return str(converted_dir(source, dtype, option))


def gguf_source_file(path: str, gguf_file: str | None, option: str = "model.path",
                     file_option: str = "model.gguf_file") -> Path | None:
    """The GGUF file this source names, or None for a model directory."""
    p = Path(path)
    if gguf_file is not None:
        if not p.is_dir():
            raise FileNotFoundError(f"{file_option} = {gguf_file!r} needs {option} to be the directory holding it, "
                                    f"but {path!r} is not a directory; set {option} to that directory, or point "
                                    f"{option} at the .gguf file and leave {file_option} unset")
        if not (p / gguf_file).is_file():
            found = sorted(f.name for f in p.glob("*.gguf"))
            raise FileNotFoundError(f"{file_option} = {gguf_file!r}: no such file in {path!r} (.gguf files there: "
                                    f"{found or 'none'}); set it to one of them")
        return p / gguf_file
    if p.is_file():
        return p
    if p.is_dir() and not (p / "config.json").is_file():
        found = sorted(f.name for f in p.glob("*.gguf"))
        if found:
            raise FileNotFoundError(f"{option} = {path!r} has no config.json but holds GGUF files {found}; set "
                                    f"{file_option} to the one to load, or point {option} at the .gguf file")
    if not p.exists() and p.suffix == ".gguf":
        raise FileNotFoundError(f"{option} = {path!r}: no such GGUF file; point it at an existing .gguf file")
    return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _signature(source: Path) -> dict:
    st = os.stat(source)
    return {"path": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def converted_dir(source: Path, dtype: str, option: str = "model.path") -> Path:
    """The Hugging Face directory converted from ``source`` in ``dtype``:
    the cached entry when it verifies, else a fresh conversion."""
    check_magic(source, option)
    require_gguf_support(source, option)
    folder, why = trusted_gguf_dir()
    signature = _signature(source)
    if folder is not None and (entry := _entry_by_signature(folder, signature, dtype)) is not None:
        return entry
    digest = sha256_file(source)
    if folder is None:
        return _private_conversion(source, digest, dtype, option, why)
    entry = folder / f"{digest[:16]}-{dtype}"
    problem = entry_problem(entry, digest, dtype)
    if problem is None:
        _remember_source(entry, signature)
        return entry
    logger.info("%s: converting GGUF %s into %s (%s)", option, source, entry, problem)
    return _publish(source, entry, digest, dtype, signature, option)


def trusted_gguf_dir() -> tuple[Path | None, str | None]:
    """``<cache root>/gguf`` (created 0700 if missing), or None and why it may not be used."""
    root = cache_root()
    folder = root / "gguf"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        return None, f"cannot create {folder}: {err}"
    reason = untrusted_reason(root) or untrusted_reason(folder)
    return (None, reason) if reason else (folder, None)


def read_marker(entry: Path) -> dict | None:
    marker = entry / MARKER
    try:
        if not os.path.isfile(marker) or os.path.islink(marker):
            return None
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def entry_problem(entry: Path, digest: str, dtype: str) -> str | None:
    """Why the cache entry may not be used (None: it may)."""
    if not os.path.lexists(entry):
        return "not cached yet"
    if (reason := untrusted_reason(entry)) is not None:
        return reason
    data = read_marker(entry)
    if data is None:
        return f"{entry / MARKER} is missing or unreadable (an unfinished or damaged entry)"
    expected = {"format": FORMAT, "source_sha256": digest, "dtype": dtype, "converter": converter_version()}
    for key, want in expected.items():
        if data.get(key) != want:
            return f"its marker records {key} = {data.get(key)!r}, not {want!r}"
    files = data.get("files")
    if not isinstance(files, dict) or "config.json" not in files:
        return "its marker lists no files"
    for name, size in files.items():
        try:
            st = os.lstat(entry / name)
        except OSError:
            return f"{entry / name} is missing"
        if not os.path.isfile(entry / name) or os.path.islink(entry / name) or st.st_size != size:
            return f"{entry / name} is not the regular file of {size} bytes the marker records"
    return None


def _entry_by_signature(folder: Path, signature: dict, dtype: str) -> Path | None:
    """The verified entry whose marker lists this exact file (path, size, mtime, inode)."""
    for marker in folder.glob(f"*-{dtype}/{MARKER}"):
        data = read_marker(marker.parent) or {}
        digest = data.get("source_sha256")
        if (isinstance(digest, str) and isinstance(data.get("sources"), list) and signature in data["sources"]
                and marker.parent.name == f"{digest[:16]}-{dtype}"
                and entry_problem(marker.parent, digest, dtype) is None):
            return marker.parent
    return None


def _remember_source(entry: Path, signature: dict) -> None:
    """Add this file's signature to the entry's marker, so its next load skips hashing."""
    data = read_marker(entry) or {}
    known = data.get("sources")
    if not isinstance(known, list) or signature in known:
        return
    data["sources"] = ([signature] + known)[:MAX_SOURCES]
    try:
        _write_atomic(entry / MARKER, json.dumps(data, indent=1))
    except OSError as err:  # a read-only cache still serves; the next load hashes again
        logger.debug("cannot update %s: %s", entry / MARKER, err)


def _finish(source: Path, out: Path, digest: str, dtype: str, signature: dict | None, option: str) -> None:
    """Convert into ``out`` and write its marker last."""
    start = time.perf_counter()
    convert(source, out, dtype, option)
    files = {str(f.relative_to(out)): f.stat().st_size for f in sorted(out.rglob("*")) if f.is_file()}
    marker = {"format": FORMAT, "source_sha256": digest, "dtype": dtype, "converter": converter_version(),
              "source_name": source.name, "files": files, "sources": [signature] if signature else []}
    (out / MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")
    logger.info("%s: converted %s in %.1f s", option, source, time.perf_counter() - start)


def _publish(source: Path, entry: Path, digest: str, dtype: str, signature: dict, option: str) -> Path:
    """Build the entry beside its final name, then rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
    try:
        _finish(source, tmp, digest, dtype, signature, option)
        try:
            os.rename(tmp, entry)
        except OSError:  # an entry is there: another process's (use it) or a stale one (replace it)
            if entry_problem(entry, digest, dtype) is None:
                return entry
            stale = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".stale", dir=entry.parent))
            os.rename(entry, stale / "old")
            os.rename(tmp, entry)
            shutil.rmtree(stale, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def _private_conversion(source: Path, digest: str, dtype: str, option: str, why: str | None) -> Path:
    """Convert into a private temporary directory (removed at exit) when the cache may not be used."""
    known = _private.get((digest, dtype))
    if known is not None and entry_problem(known, digest, dtype) is None:
        return known
    folder = Path(tempfile.mkdtemp(prefix="speculant-gguf-"))
    atexit.register(shutil.rmtree, folder, True)
    logger.warning("%s: not caching the conversion of %s (%s); converting into the private temporary "
                   "directory %s, removed at exit", option, source, why, folder)
    _finish(source, folder, digest, dtype, None, option)
    _private[(digest, dtype)] = folder
    return folder
