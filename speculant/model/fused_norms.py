"""Run RMSNorm layers as one fused ``F.rms_norm`` call where that is bit-identical.

transformers spells RMSNorm (Llama, Mistral, Qwen2, ...) as five or six
separate tensor operators. At decode sizes on CPU each costs its fixed
operator overhead, so a 6-layer model's 13 norms took ~15 % of a forward; the
fused kernel is about twice as fast per norm. ``fuse_rms_norms`` swaps the
forward of every module that looks like an RMSNorm (class name ending in
``RMSNorm``, a 1-D ``weight`` and a float ``variance_epsilon``) for one fused
call, but only after a probe on random inputs gives exactly the module's own
output. The fused formulas are tried in turn: the norm in the model's dtype
(float32 models), and the norm computed in float32 then rounded to the
model's dtype before the weight multiplies it (what Llama-style norms do in
bfloat16 and float16), first as torch's own reduced-precision ``rms_norm``
(which computes in float32 and rounds once: one operator), then spelled out.
Variants with another formula (Gemma's ``1 + weight``) fail every probe and
keep their own forward. For bfloat16 on the CPU the first candidates are a C
kernel (``csrc/rms_norm.c``, one call instead of torch's eight operators) that
follows ATen's float32 summation order; it too is taken only where the probe
shows it bit-identical.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Protocol, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from speculant.model.kernels.build import load_kernel


class _RMSNormLike(Protocol):
    """A module ``_looks_like_rms_norm`` accepted."""

    weight: torch.Tensor
    variance_epsilon: float
    forward: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor: ...


def _fused_forward(self: _RMSNormLike, hidden_states: torch.Tensor) -> torch.Tensor:
    # hidden_states: [..., H] -> [..., H]
    return F.rms_norm(hidden_states, (self.weight.shape[0],), self.weight, self.variance_epsilon)


def _fused_upcast_forward(self: _RMSNormLike, hidden_states: torch.Tensor) -> torch.Tensor:
    # hidden_states: [..., H] (bfloat16 / float16) -> [..., H]; normalised in float32, rounded, then scaled
    normed = F.rms_norm(hidden_states.float(), (self.weight.shape[0],), eps=self.variance_epsilon)
    return self.weight * normed.to(hidden_states.dtype)


def _fused_rounded_forward(self: _RMSNormLike, hidden_states: torch.Tensor) -> torch.Tensor:
    # hidden_states: [..., H] (bfloat16 / float16) -> [..., H]; the same as _fused_upcast_forward where
    # torch normalises a reduced-precision input in float32 and rounds once (one operator, not three)
    return self.weight * F.rms_norm(hidden_states, (self.weight.shape[0],), eps=self.variance_epsilon)


def _c_kernel_form(lanes: int) -> Callable[[_RMSNormLike, torch.Tensor], torch.Tensor] | None:
    """The C kernel (``csrc/rms_norm.c``) following ATen's float32 sum over vectors of
    ``lanes`` floats, for bfloat16 norms; None where the kernel cannot be loaded."""
    lib = load_kernel()
    if lib is None:
        return None
    kernel = lib.speculant_rms_norm_bf16

    def forward(self: _RMSNormLike, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: [..., H] bfloat16 -> [..., H]
        width = self.weight.shape[0]
        if hidden_states.dtype != torch.bfloat16 or hidden_states.device.type != "cpu":
            return _fused_rounded_forward(self, hidden_states)
        rows = hidden_states.reshape(-1, width)  # [T, H]
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty(rows.shape, dtype=torch.bfloat16)
        kernel(rows.data_ptr(), rows.shape[0], rows.stride(0), self.weight.data_ptr(), width,
               self.variance_epsilon, lanes, out.data_ptr(), width, torch.get_num_threads())
        return out.view(hidden_states.shape)
    forward.__name__ = f"_c_kernel_forward_{lanes}_lanes"
    forward.c_kernel_lanes = lanes  # type: ignore[attr-defined]  # read by fast_forward/fused_layers.py
    return forward


def torch_sum_lanes(width: int) -> int | None:
    """The vector width (lanes) whose summation order gives torch's own float32 sums of squares
    of bfloat16 rows of ``width``, bit for bit on every row of a random probe; None if none does.
    The final bfloat16 output rarely shows a wrong order (one row in hundreds), these sums
    almost always do, so the order is settled here and not left to the output probe."""
    lib = load_kernel()
    if lib is None:
        return None
    gen = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(64, width, generator=gen)).to(torch.bfloat16)  # [64, H]
    want = torch.cat([x[:1].float().pow(2).sum(-1), x.float().pow(2).sum(-1)])  # one row alone, then 64
    for lanes in (16, 8, 4):
        got = torch.empty(65)
        lib.speculant_sum_squares_bf16(x.data_ptr(), 1, width, width, lanes, got.data_ptr())
        lib.speculant_sum_squares_bf16(x.data_ptr(), 64, width, width, lanes, got[1:].data_ptr())
        if torch.equal(got, want):
            return lanes
    return None


def _forms(module: _RMSNormLike) -> list[Callable[[_RMSNormLike, torch.Tensor], torch.Tensor]]:
    """The fused formulas to try, fastest first: the C kernel (bfloat16 CPU norms with a
    contiguous weight, in the summation order torch follows for this width), then torch's fused calls."""
    forms: list[Callable[[_RMSNormLike, torch.Tensor], torch.Tensor]] = []
    weight = module.weight
    if weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.is_contiguous():
        lanes = torch_sum_lanes(weight.shape[0])
        form = _c_kernel_form(lanes) if lanes is not None else None
        forms += [form] if form is not None else []
    return forms + list(FUSED_FORMS)


FUSED_FORMS = (_fused_forward, _fused_rounded_forward, _fused_upcast_forward)


def _looks_like_rms_norm(module: nn.Module) -> TypeGuard[_RMSNormLike]:
    weight = getattr(module, "weight", None)
    return (type(module).__name__.endswith("RMSNorm") and isinstance(weight, torch.Tensor)
            and weight.dim() == 1 and isinstance(getattr(module, "variance_epsilon", None), float))


@torch.inference_mode()
def _probe(module: _RMSNormLike, form: Callable[[_RMSNormLike, torch.Tensor], torch.Tensor]) -> bool:
    """``form`` equals the module's own forward on random inputs of 1, 5, 64 and 512 rows."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    hidden = module.weight.shape[0]
    for shape in ((1, 1, hidden), (1, 5, hidden), (1, 64, hidden), (1, 512, hidden)):
        x = (3 * torch.randn(*shape, generator=gen)).to(module.weight.device, module.weight.dtype)
        if not torch.equal(module(x), form(module, x)):
            return False
    return True


def fuse_rms_norms(model: nn.Module) -> tuple[int, int]:
    """Fuse every probe-exact RMSNorm of ``model`` in place; returns (fused, kept)."""
    fused = kept = 0
    for module in model.modules():
        if not _looks_like_rms_norm(module):
            continue
        form = next((f for f in _forms(module) if _probe(module, f)), None)
        if form is not None:
            module.forward = types.MethodType(form, module)
            fused += 1
        else:
            kept += 1
    return fused, kept
