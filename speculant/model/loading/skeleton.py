"""Load a GGUF checkpoint kept quantized without building its dense weights first.

``model.quantization = "gguf"`` replaces most of a model's weights by the file's
quantized blocks (``gguf_quant.keep_quantized``). Loading the whole dense
conversion first only to drop it costs the cold start most of its time (3.1 GB
of bfloat16 read and copied at 1.5B). Here the model is built as a skeleton:

1. every parameter is created on the meta device (no memory, no initialisation),
   while buffers stay real, since they are computed from the config (rotary
   frequencies), not read from the checkpoint;
2. the small tensors that stay in torch whatever happens (norms, biases) are read
   from the conversion's safetensors, by their parameter names;
3. ``keep_quantized`` swaps in the quantized layers, checking each layout against
   a few rows read from the conversion instead of the whole dense weight;
4. whatever is still on the meta device (a weight left dequantized, an embedding
   without a kernel) is read from the conversion as the full path would.

The result is the model the full path gives, tensor for tensor (tested). Where a
parameter has no tensor of its name in the conversion (a model whose checkpoint
keys differ from its parameter names), ``SkeletonMiss`` says so, and the caller
loads the full model instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

INDEX = "model.safetensors.index.json"


class SkeletonMiss(LookupError):
    """A parameter the conversion has no tensor for, under the parameter's own name."""


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Parameters registered inside are moved to the meta device as they are registered, so a
    module's own initialisation of them (``reset_parameters``) costs nothing; buffers stay real.
    Patches ``nn.Module.register_parameter`` for the duration: build nothing else meanwhile."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


class CheckpointTensors:
    """The safetensors files of a Hugging Face directory, read one tensor (or a few rows) at a time."""

    def __init__(self, model_dir: Path) -> None:
        index = model_dir / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = {name: model_dir / file for name, file in weight_map.items()}
        else:
            single = model_dir / "model.safetensors"
            with safe_open(single, framework="pt") as f:
                files = {name: single for name in f.keys()}
        self._files = files
        self._open: dict[Path, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def _handle(self, name: str) -> Any:
        path = self._files[name]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="pt")
        return self._open[path]

    def tensor(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def rows(self, name: str, weight: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
        """Rows ``rows`` of tensor ``name`` ([len(rows), K]); a ``gguf_quant.RowReader``."""
        if weight.device.type != "meta":
            return weight[torch.from_numpy(rows)]
        if name not in self:
            raise SkeletonMiss(f"the conversion has no tensor {name!r}")
        part = self._handle(name).get_slice(name)
        return torch.cat([part[int(r):int(r) + 1] for r in rows])


def meta_places(model: nn.Module) -> dict[int, list[tuple[nn.Module, str, str]]]:
    """Every parameter still on the meta device -> where it sits: (module, attribute, qualified name),
    more than one place for a tied weight."""
    places: dict[int, list[tuple[nn.Module, str, str]]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for attr, param in module._parameters.items():
            if param is not None and param.device.type == "meta":
                places.setdefault(id(param), []).append((module, attr, f"{prefix}.{attr}" if prefix else attr))
    return places


def materialise(model: nn.Module, tensors: CheckpointTensors, skip_weights_of: tuple[type, ...] = ()) -> None:
    """Read every meta parameter of ``model`` from ``tensors`` in its own dtype, tied places sharing
    one tensor; the ``weight`` of modules of the types ``skip_weights_of`` stays on the meta device."""
    for places in meta_places(model).values():
        if any(attr == "weight" and isinstance(module, skip_weights_of) for module, attr, _ in places):
            continue
        name = next((q for _, _, q in places if q in tensors), None)
        if name is None:
            raise SkeletonMiss(f"the conversion has no tensor for parameter {places[0][2]!r}")
        module, attr, _ = places[0]
        meta = module._parameters[attr]
        assert meta is not None  # meta_places lists parameters only
        value = nn.Parameter(tensors.tensor(name).to(meta.dtype), requires_grad=False)
        for module, attr, _ in places:
            module._parameters[attr] = value
    for prefix, module in model.named_modules():  # persistent buffers the checkpoint carries
        for attr, buf in module._buffers.items():
            name = f"{prefix}.{attr}" if prefix else attr
            if buf is not None and attr not in module._non_persistent_buffers_set and name in tensors:
                module._buffers[attr] = tensors.tensor(name).to(buf.dtype)
