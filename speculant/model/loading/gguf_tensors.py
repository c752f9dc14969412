"""A GGUF file's tensors and scalar metadata, read without parsing its metadata arrays.

``gguf.GGUFReader`` builds a numpy view per part of every field: at 1.5B its parse of the ~300k tokenizer
strings took 15 s of a 21 s cold start. This reader steps over arrays and maps the tensor data read-only:
``fields[key].contents()`` and ``tensors`` (``name``, ``tensor_type``, ``data``; quantized: ``[rows, row_bytes]``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_FLOATS = {"F32": np.float32, "F16": np.float16}


@dataclass(frozen=True)
class Field:
    value: Any

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: the row length first
    data: np.ndarray


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        """A scalar or string value; an array is stepped over and read as None."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item == _STRING:  # each string: its 8-byte length, then its bytes (a tokenizer: 150k of them)
                buf, pos, length = self.buf, self.pos, _U64.unpack_from
                for _ in range(count):
                    pos += 8 + length(buf, pos)[0]
                self.pos = pos
            elif item == _ARRAY:
                for _ in range(count):
                    self.value(_ARRAY)
            else:
                self.pos += count * struct.calcsize(_SCALARS[item])
            return None
        return self.take(_SCALARS[kind])


class GGUFTensors:
    """``path``'s scalar metadata (``fields``) and tensors (``tensors``)."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        mapped = np.memmap(self.path, dtype=np.uint8, mode="r")
        cur = _Cursor(mapped.data)
        if bytes(mapped[:4]) != b"GGUF":
            raise ValueError(f"{self.path}: not a GGUF file (its first bytes are {bytes(mapped[:4])!r}, not b'GGUF')")
        cur.pos = 4
        version, n_tensors, n_fields = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
        if version < 2:
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (2 or later); re-convert the file")
        self.fields: dict[str, Field] = {}
        for _ in range(n_fields):
            key = cur.string()
            value = cur.value(cur.take("<I"))
            if value is not None:
                self.fields[key] = Field(value)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.take("<Q") for _ in range(cur.take("<I")))
            infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
        align = int(self.fields.get("general.alignment", Field(32)).value)
        start = -(-cur.pos // align) * align
        self.tensors = []
        for name, dims, kind, offset in infos:
            qtype = gguf.GGMLQuantizationType(kind)
            block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
            row_bytes = dims[0] // block_elems * block_bytes
            raw = mapped[start + offset:start + offset + rows * row_bytes]
            dtype = _FLOATS.get(qtype.name)
            data = raw.view(dtype).reshape(*dims[::-1]) if dtype is not None else \
                raw.reshape(*dims[:0:-1], row_bytes)
            self.tensors.append(Tensor(name, qtype, dims, data))
