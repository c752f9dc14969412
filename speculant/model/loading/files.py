"""Check a model directory's weight files before loading them, so a truncated
or corrupt ``*.safetensors`` file is reported with its path and what is wrong
instead of a raw ``SafetensorError`` from deep inside ``from_pretrained``.

A safetensors file is an 8-byte little-endian header length ``N``, then ``N``
bytes of JSON mapping each tensor name to its ``dtype``, ``shape`` and
``data_offsets`` ``[begin, end]`` (relative to the data after the header),
then the data. :func:`check_weight_files` reads only the headers.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from safetensors import SafetensorError  # noqa: F401  (re-exported for model_loading)

DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
MAX_HEADER_BYTES = 100 << 20  # the safetensors library refuses larger headers too
INDEX_FILE = "model.safetensors.index.json"
FIX = "re-download the model or save it again with model.save_pretrained()"


class ModelFileError(ValueError):
    """A weight file of the model directory is missing, truncated or corrupt."""


class UnsupportedModelError(ValueError):
    """The model uses a feature speculant's attention would get wrong."""


def _fail(option: str, path: Path, what: str) -> ModelFileError:
    return ModelFileError(f"{option}: weight file {str(path)!r} {what}; {FIX}")


def check_safetensors_file(path: Path, option: str = "model.path") -> int:
    """Validate one file's header against its size; return its tensor count.
    Raises ``ModelFileError`` naming the file and the problem."""
    size = path.stat().st_size
    if size < 8:
        raise _fail(option, path, f"is truncated: {size} bytes, shorter than the 8-byte header length")
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise _fail(option, path, f"is not a safetensors file: its header length field says {n} bytes")
        if 8 + n > size:
            raise _fail(option, path, f"is truncated: the header needs {8 + n} bytes but the file has {size}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(option, path, f"has a corrupt header (not valid UTF-8 JSON: {exc})") from None
    if not isinstance(header, dict):
        raise _fail(option, path, "has a corrupt header (a JSON object was expected)")
    data_size = size - 8 - n
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, info in tensors.items():
        _check_tensor(option, path, name, info, data_size)
    return len(tensors)


def _check_tensor(option: str, path: Path, name: str, info: object, data_size: int) -> None:
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    shape = info.get("shape") if isinstance(info, dict) else None
    if not (isinstance(info, dict)
            and isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise _fail(option, path, f"has a corrupt header entry for tensor {name!r}: {info!r}")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise _fail(option, path, f"has invalid data_offsets {offsets} for tensor {name!r}")
    if end > data_size:
        raise _fail(option, path, f"is truncated: tensor {name!r} ends at data byte {end} but the file holds "
                                  f"only {data_size} data bytes")
    itemsize = DTYPE_BYTES.get(str(info.get("dtype")))
    if itemsize is not None and end - begin != math.prod(shape) * itemsize:
        raise _fail(option, path, f"is corrupt: tensor {name!r} ({info.get('dtype')} {shape}) needs "
                                  f"{math.prod(shape) * itemsize} bytes but data_offsets {offsets} give {end - begin}")


def check_weight_files(model_dir: str | Path, option: str = "model.path") -> list[Path]:
    """Validate every ``*.safetensors`` file of ``model_dir`` (and, when there
    is an index, that every shard it names exists); return the files checked.
    Directories without safetensors files are left to ``from_pretrained``."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _fail(option, index, f"is not a valid safetensors index ({type(exc).__name__}: {exc})") from None
        missing = sorted(s for s in shards if not (model_dir / str(s)).is_file())
        if missing:
            raise _fail(option, index, f"names shard(s) that do not exist: {', '.join(map(str, missing[:5]))}")
    for path in files:
        check_safetensors_file(path, option)
    return files


def weight_load_error(exc: Exception, model_dir: str | Path, option: str = "model.path") -> ModelFileError:
    """A ``ModelFileError`` naming ``model_dir`` for a ``SafetensorError`` that
    ``from_pretrained`` raised despite :func:`check_weight_files`."""
    return ModelFileError(f"{option}: cannot read the weights in {str(model_dir)!r} "
                          f"({type(exc).__name__}: {exc}); {FIX}")


def read_text_config(model_dir: str | Path) -> dict:
    """The language model's settings from ``model_dir/config.json``: its
    ``text_config`` section when it has one (multimodal wrappers), else the
    whole file. Read without loading the model, for checks at config time."""
    data = json.loads((Path(model_dir) / "config.json").read_text())
    return data.get("text_config", data)
