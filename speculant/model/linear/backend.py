"""Run a model's linear layers on the fastest exact CPU path for small token counts.

Speculative decoding pays only when verifying ``k + 1`` tokens costs about one
decode. On CPU the default ``F.linear`` (MKL) falls well off the
memory-bandwidth bound from a few rows on, while oneDNN with its weight
reordered once into its blocked layout stays close to it for decode and verify
row counts and is as fast for prefill-sized ones. On some CPUs MKL is faster at
one to a few rows; ``dense_max_rows`` keeps those cases on MKL for the memory of
a second weight copy. ``benchmarks/bench_linear.py`` measures all of this; the
figures, with the CPU and date of each, are in ``benchmarks/README.md``.

``pack_linear_layers(model, backend)`` is a one-time load step: every plain
``torch.nn.Linear`` (and transformers' ``Conv1D``, GPT-2's transposed linear)
becomes a ``PackedLinear`` holding the packed weight, after a per-layer
exactness probe: a ``DotLinear`` (``dot_linear.py``, Speculant's own kernel on
AVX512-BF16 dot products) for bfloat16 weights on CPUs that have those
instructions, else a ``OneDNNLinear``. Packing is the last load step: tie, resize or cast the
model before it, not after (packed weights are opaque oneDNN tensors that
``model.to()``, ``state_dict()`` and ``copy.deepcopy`` do not handle).

Vocabulary:

* **packed weight**: the ``[out, in]`` weight reordered by
  ``torch.ops.mkldnn._reorder_linear_weight`` into oneDNN's blocked layout.
* **probe**: the packed path vs the original layer's own forward on random
  inputs of 1 and 7 rows; the largest difference is divided by the largest
  reference output (``PROBE_TOLERANCE`` per dtype). A layer whose probe fails
  stays on the default path, with a warning.
* **tied weight**: a weight that another module of the model also holds (e.g.
  ``lm_head`` tied to ``embed_tokens``). The other module keeps it; the packed
  copy is extra memory. An untied dense weight is released once packed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TypeGuard

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from speculant.model.linear.dot_linear import DotLinear, dot_linear_unavailable_reason
from speculant.model.linear.onednn import OneDNNLinear, onednn_unavailable_reason
from speculant.model.linear.packed import PackedLinear

LINEAR_BACKENDS = ("auto", "default", "onednn", "avx512_bf16")

# Largest allowed |packed - default| / max|default| in the probe. float32: the two
# paths differ only in summation order, measured <= ~5e-6 relative; 1e-4 leaves
# headroom while a layout or indexing bug gives errors of order 1. bfloat16: both
# round their float32 accumulators to bfloat16, so one rounding step may differ:
# one bf16 ulp is 2^-7 relative, and 2^-6 of the largest output covers that.
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2.0**-6}
PROBE_SHAPES = ((1,), (1, 7))  # leading dims of the probe inputs: [1, in] and [1, 7, in]


KIND_NAMES: dict[type, str] = {OneDNNLinear: "onednn", DotLinear: "avx512_bf16"}
"""Packed layer class -> its ``model.linear_backend`` name."""


class LinearBackendError(ValueError):
    """``model.linear_backend`` asks for a backend this model or machine cannot use."""


@dataclass(frozen=True)
class LinearPackReport:
    """What ``pack_linear_layers`` did, for logs and the CLI summary."""

    requested: str
    """The ``model.linear_backend`` value received."""
    backend: str
    """The packed kinds in use (``avx512_bf16``, ``onednn``, or both joined by ``+``), else ``default``."""
    num_packed: int
    """Linear layers packed by this call."""
    num_already_packed: int
    """Packed layers found from an earlier call (packing is idempotent)."""
    num_default: int
    """``nn.Linear`` layers left on the default path (ineligible or failed probe)."""
    packed_bytes: int
    """Bytes of the packed weights created by this call."""
    freed_bytes: int
    """Bytes of dense weights released (untied weights that were packed)."""
    max_probe_error: float
    """Largest relative probe error among packed layers (0.0 when none)."""
    reason: str = ""
    """Why layers stayed on the default path; empty when every layer packed."""

    def describe(self) -> str:
        """One line for ``speculant generate --verbose``."""
        packed = self.num_packed + self.num_already_packed
        text = (f"{self.backend} ({packed} layer(s) packed, {self.num_default} on F.linear; "
                f"requested {self.requested!r})")
        return text + (f"; {self.reason}" if self.reason else "")

    @property
    def extra_bytes(self) -> int:
        """Net memory added by packing: packed copies minus released dense weights."""
        return self.packed_bytes - self.freed_bytes


def linear_weight_of(layer: nn.Module) -> torch.Tensor | None:
    """The ``[out, in]`` weight (a view) of a layer this module packs, else ``None``.

    Only exact ``nn.Linear`` and ``Conv1D`` (weight stored ``[in, out]``) qualify:
    subclasses may override ``forward`` (quantized or adapter layers) or read
    ``.weight`` directly (``nn.MultiheadAttention``'s ``out_proj``).
    """
    return _dense_weight(layer) if _packable(layer) else None


def _packable(layer: nn.Module) -> TypeGuard[nn.Linear | Conv1D]:
    """An exact ``nn.Linear`` or ``Conv1D`` (see ``linear_weight_of``)."""
    return type(layer) is nn.Linear or type(layer) is Conv1D


def _dense_weight(layer: nn.Linear | Conv1D) -> torch.Tensor:
    # [out, in]: Conv1D stores its weight [in, out]
    return layer.weight.t() if type(layer) is Conv1D else layer.weight


def probe_error(layer: nn.Module, packed: PackedLinear) -> float:
    """Largest ``|packed - layer| / max|layer|`` over the probe inputs."""
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    with torch.no_grad():
        for lead in PROBE_SHAPES:
            x = torch.randn(*lead, packed.in_features, generator=gen)
            x = x.to(packed.dtype)  # [*lead, in]
            ref = layer(x).float()  # [*lead, out]
            got = packed.probe_forward(x).float()
            if got.shape != ref.shape:
                return float("inf")
            scale = ref.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
            worst = max(worst, ((got - ref).abs().max() / scale).item())
    return worst


def _linear_slots(model: nn.Module) -> list[tuple[str, nn.Module, str, nn.Linear | Conv1D]]:
    """Every (qualified name, parent, attribute, layer) holding a layer that
    ``linear_weight_of`` accepts; a layer held by several parents appears once per parent."""
    slots = []
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for attr, child in parent.named_children():
            if _packable(child):
                name = f"{parent_name}.{attr}" if parent_name else attr
                slots.append((name, parent, attr, child))
    return slots


def _shared_weight_ids(model: nn.Module) -> set[int]:
    """Ids of parameters that more than one module holds (tied weights)."""
    holders: dict[int, int] = {}
    for module in model.modules():  # each module once, however many parents hold it
        for param in module.parameters(recurse=False):
            holders[id(param)] = holders.get(id(param), 0) + 1
    return {pid for pid, count in holders.items() if count > 1}


def _check_backend(backend: str, slots: list[tuple[str, nn.Module, str, nn.Linear | Conv1D]]) -> None:
    """Raise ``LinearBackendError`` for an unknown value, or 'onednn' that cannot run."""
    if backend not in LINEAR_BACKENDS:
        raise LinearBackendError(
            f"model.linear_backend = {backend!r} is not a linear backend; "
            f"choose one of {', '.join(repr(b) for b in LINEAR_BACKENDS)}.")
    check, fix = {
        "onednn": (onednn_unavailable_reason, "load the model on the CPU with model.dtype = 'float32' or 'bfloat16'"),
        "avx512_bf16": (dot_linear_unavailable_reason,
                        "load the model on the CPU with model.dtype = 'bfloat16', on a CPU with AVX2+FMA or AVX-512"),
    }.get(backend, (None, ""))
    if check is None:
        return
    for name, _, _, layer in slots:
        reason = check(_dense_weight(layer))
        if reason is not None:
            raise LinearBackendError(
                f"model.linear_backend = {backend!r} cannot run layer '{name}': {reason}. "
                "Set model.linear_backend = 'auto' (packs each layer for the fastest kernel that "
                f"supports it, runs the rest on the default path) or 'default'; or {fix}.")


def _try_pack(layer: nn.Linear | Conv1D, backend: str, dense_max_rows: int) -> tuple[PackedLinear | None, float, str]:
    """Pack and probe one layer: (packed or None, probe error, why not packed). ``auto``
    takes the dot-product kernel where it runs the layer, else oneDNN."""
    weight = _dense_weight(layer)  # [out, in]
    dot_reason = dot_linear_unavailable_reason(weight) if backend in ("auto", "avx512_bf16") else "not asked for"
    packed: PackedLinear
    if dot_reason is None:
        packed = DotLinear(weight, layer.bias)
    else:
        reason = onednn_unavailable_reason(weight)
        if reason is not None:
            return None, 0.0, reason
        packed = OneDNNLinear(weight, layer.bias, dense_max_rows)
    error = probe_error(layer, packed)
    tolerance = PROBE_TOLERANCE[weight.dtype]
    if not error <= tolerance:  # also catches NaN
        return None, error, (f"packed output differs by {error:.2e} of the output scale "
                             f"(probe tolerance {tolerance:.1e})")
    return packed, error, ""


def pack_linear_layers(
    model: nn.Module, backend: str = "auto", *, dense_max_rows: int = 0
) -> LinearPackReport:
    """Replace every plain ``nn.Linear`` and ``Conv1D`` of ``model`` by a packed linear.

    ``backend``: ``"default"`` packs nothing; ``"onednn"`` (``OneDNNLinear``) and
    ``"avx512_bf16"`` (``DotLinear``) pack every layer on that kernel or raise
    ``LinearBackendError`` naming the option, the value, the reason and the fix;
    ``"auto"`` packs each layer for the dot-product kernel where it runs it
    (bfloat16 on a CPU with AVX512-BF16), else for oneDNN where that supports it
    (CPU, float32/bfloat16), and leaves the rest on ``F.linear``. A layer failing the exactness probe stays on
    the default path, with one ``RuntimeWarning`` for all such layers. Calling this
    again packs nothing new. Call once after loading, before serving.

    ``dense_max_rows=N`` keeps each dense weight and runs inputs of at most N
    rows on it (see ``OneDNNLinear``): faster decode without
    speculation, for the memory of a second copy of every packed weight
    (``extra_bytes`` says how much). 0, the default, releases the dense weights.
    """
    if dense_max_rows < 0:
        raise ValueError(f"dense_max_rows must be >= 0, got {dense_max_rows}")
    slots = _linear_slots(model)
    _check_backend(backend, slots)
    num_already = len({id(m) for m in model.modules() if isinstance(m, PackedLinear)})
    shared = _shared_weight_ids(model)
    outcome: dict[int, PackedLinear | None] = {}  # id(layer) -> packed, None = default
    reasons: dict[str, str] = {}  # layer name -> why it stays on the default path
    failed_probe: list[str] = []
    packed_bytes = freed_bytes = 0
    worst = 0.0
    with torch.no_grad():
        for name, parent, attr, layer in slots:
            if id(layer) not in outcome:
                if backend == "default":
                    packed, error, reason = None, 0.0, "model.linear_backend = 'default'"
                else:
                    packed, error, reason = _try_pack(layer, backend, dense_max_rows)
                outcome[id(layer)] = packed
                if packed is None:
                    reasons[name] = reason
                    if error != 0.0:  # ran the probe and failed it (NaN included)
                        failed_probe.append(name)
                else:
                    worst = max(worst, error)
                    nbytes = layer.weight.numel() * layer.weight.element_size()
                    packed_bytes += nbytes
                    tied = id(layer.weight) in shared
                    kept = isinstance(packed, OneDNNLinear) and packed.dense_weight is not None
                    freed_bytes += 0 if tied or kept else nbytes
            if outcome[id(layer)] is not None:
                setattr(parent, attr, outcome[id(layer)])
    if failed_probe:
        warnings.warn(f"{len(failed_probe)} linear layer(s) stay on the default path, e.g. "
                      f"'{failed_probe[0]}': {reasons[failed_probe[0]]}", RuntimeWarning,
                      stacklevel=2)
    summary = ""
    if reasons:
        name, reason = next(iter(reasons.items()))
        summary = f"{len(reasons)} linear layer(s) on the default path, e.g. '{name}': {reason}"
    num_packed = len(outcome) - len(reasons)
    return LinearPackReport(
        requested=backend,
        backend="+".join(sorted({KIND_NAMES[type(m)] for m in model.modules() if isinstance(m, PackedLinear)}))
        or "default",
        num_packed=num_packed,
        num_already_packed=num_already,
        num_default=len(reasons),
        packed_bytes=packed_bytes,
        freed_bytes=freed_bytes,
        max_probe_error=worst,
        reason=summary,
    )
