"""Load-time self-test: the paged path must reproduce the model's own attention.

The probe (``attention/seam_probe.py``) refuses every feature it can see in the
attention function's arguments; this is the backstop for what it cannot see,
such as a model that post-processes attention output, ignores ``position_ids``
or mixes tokens outside attention. Two short sequences run through the engine's
path (a mixed batch: a prefill chunk of each, then a multi-token continuation
and a single-token decode over their cached prefixes) and through transformers'
own ``eager`` attention one sequence at a time.

Layer by layer (``layer_reference.py``): every decoder layer gets the same
input on both paths (the eager path's), and each path's output is measured
against the same layer upcast to float32 (float64 for float32 models). The
engine's path is refused only where its error is clearly larger than
transformers' own: more than ``RATIO`` times it plus ``FLOOR``. Two correct
bfloat16 paths may drift apart over many layers (they round in different
places), so comparing them with each other would refuse the more accurate one
as readily as a wrong one; a wrong seam (a position, a missing key, a scale)
is off by tens of percent at the first layer it touches. Models whose decoder
layers cannot be found compare whole-model logits instead (``TOLERANCE``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from speculant.interfaces.span_tensors import PagedSpan
from speculant.model.layer_reference import (
    Call,
    decoder_layers,
    hidden_of,
    hooked,
    output_of,
    reference_outputs,
    token_error,
    token_errors,
    with_hidden,
)
from speculant.model.linear.quantized import activation_rounding

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# whole-model fallback: max |ours - transformers| / max(1, max |logit|); float32 noise measured on the
# architecture matrix is ~1e-6, a real fault (wrong position, missing K/V, bidirectional layer) is O(0.1-10)
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}
REFERENCE_DTYPE = {torch.float64: torch.float64, torch.float32: torch.float64}  # else float32
RATIO = 3.0
"""Per layer, the engine's error may be this many times transformers' own error..."""
FLOOR = {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 1e-3}
"""... plus this much (per-token relative L2 error): about one rounding of the dtype."""
_LENGTHS = (7, 6)  # sequence A: 4 + 3 tokens; sequence B: 5 + 1 token
_SPLITS = (4, 5)


@dataclass(frozen=True)
class SelfTestResult:
    """What the self-test measured: the engine's largest error, and transformers' own largest
    error against the same reference (None for the whole-model logits comparison)."""

    engine_error: float
    transformers_error: float | None
    worst_layer: int | None = None

    def describe(self) -> str:
        if self.transformers_error is None:
            return f"logits within {self.engine_error:.3g} of transformers' own attention"
        return (f"largest per-layer error against an upcast reference {self.engine_error:.3g} "
                f"(layer {self.worst_layer}; transformers' own: {self.transformers_error:.3g})")


class SeamSelfTestError(ValueError):
    """The engine's attention path disagrees with transformers' on this model."""


def _reference_logits(model: PreTrainedModel, ids: list[int], device: torch.device) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    return out.logits[0].float()  # [len(ids), V]


def _swap_to_reference(model: PreTrainedModel) -> str:
    """Switch the model to transformers' own attention; return the name used."""
    for name in ("eager", "sdpa"):
        try:
            model.set_attn_implementation(name)
            return name
        except (ValueError, ImportError, NotImplementedError):
            continue
    raise SeamSelfTestError("transformers offers neither 'eager' nor 'sdpa' attention for this model, "
                            "so speculant cannot check its own attention against it")


Forward = list[tuple[int, PagedSpan]]  # (test sequence, its span) in one engine forward


def _engine_forwards(runner, seqs: list[list[int]], fn: Callable[[Forward, torch.Tensor], None] | None,
                     before: Callable[[Forward], None] | None = None) -> None:
    """Run ``seqs`` through the engine as a mixed batch (a prefill chunk of each, then a
    continuation and a decode over their cached prefixes); ``before(forward)`` before each,
    ``fn(forward, logits)`` after it."""
    tables = runner.scratch_tables([len(s) for s in seqs])
    forwards: list[Forward] = [[], []]
    for i, (seq, table, split) in enumerate(zip(seqs, tables, _SPLITS)):
        split = min(split, len(seq) - 1) if len(seq) > 1 else 1
        forwards[0].append((i, PagedSpan(table, 0, seq[:split], list(range(split)))))
        if split < len(seq):
            rest = seq[split:]
            forwards[1].append((i, PagedSpan(table, split, rest, list(range(len(rest))))))
    for spans in filter(None, forwards):
        if before is not None:
            before(spans)
        logits = runner.forward([s for _, s in spans]).logits
        if fn is not None:
            fn(spans, logits)


def _test_sequences(runner) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    room = min(runner.max_model_len, runner.num_blocks * runner.block_size)
    lengths = [min(n, room) for n in _LENGTHS]
    seqs = [torch.randint(0, runner.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    return seqs[:len(runner.scratch_tables(lengths))]  # a pool this small holds one test sequence


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@torch.inference_mode()
def seam_self_test(runner, seam_name: str) -> SelfTestResult:
    """Run the test on ``runner`` (a ModelRunner with caches allocated); return what it
    measured, raise :class:`SeamSelfTestError` if the engine's error is too large."""
    layers = decoder_layers(runner.model)
    seqs = _test_sequences(runner)
    if layers is None:
        return _logits_test(runner, seam_name, seqs)
    return _layer_test(runner, seam_name, seqs, layers)


def _layer_test(runner, seam_name: str, seqs: list[list[int]], layers) -> SelfTestResult:
    model, dtype = runner.model, runner.model.dtype
    calls: list[list[Call]] = [[] for _ in layers]  # [layer][sequence]: the eager path's call
    eager: list[list[torch.Tensor]] = [[] for _ in layers]  # [layer][sequence]: its output [n, H]

    def capture(i, args, kwargs, out) -> None:
        calls[i].append(with_hidden(args, kwargs, hidden_of(args, kwargs).clone()))
        eager[i].append(output_of(out)[0].clone())

    ref_dtype = REFERENCE_DTYPE.get(dtype, torch.float32)
    used = _swap_to_reference(model)
    try:
        with hooked(layers, None, capture):
            for seq in seqs:
                model(input_ids=torch.tensor([seq], device=runner.device), use_cache=False)
        refs = [[r[0] for r in reference_outputs(layer, calls[i], ref_dtype)] for i, layer in enumerate(layers)]
    finally:
        model.set_attn_implementation(seam_name)
    inputs = [[hidden_of(*c)[0] for c in per_layer] for per_layer in calls]  # [layer][sequence] [n, H]
    ours: list[list[list[torch.Tensor]]] = [[[] for _ in seqs] for _ in layers]  # pieces, in position order
    embed_error = 0.0
    current: Forward = []

    def substitute(i, args, kwargs):
        nonlocal embed_error
        pieces = [inputs[i][s][span.start:span.end] for s, span in current]
        if i == 0:  # what the engine feeds the first layer must be what transformers feeds it
            embed_error = max(embed_error, token_error(hidden_of(args, kwargs)[0], torch.cat(pieces)))
        return with_hidden(args, kwargs, torch.cat(pieces).unsqueeze(0))

    def record(i, args, kwargs, out) -> None:
        rows, offset = output_of(out)[0], 0
        for s, span in current:
            ours[i][s].append(rows[offset:offset + span.num_tokens])
            offset += span.num_tokens

    def before(spans: Forward) -> None:
        current[:] = spans

    with hooked(layers, substitute, record):
        _engine_forwards(runner, seqs, None, before)
    floor, worst, worst_layer, theirs_worst = max(FLOOR.get(dtype, 1e-3), activation_rounding(model)), 0.0, 0, 0.0
    if embed_error > floor:
        raise SeamSelfTestError(
            f"the engine's input to the first decoder layer differs from transformers' (by {embed_error:.3g}): "
            "the model computes something from positions or the batch outside attention (an absolute "
            "position embedding that ignores position_ids?), which speculant's flattened batches do not reproduce")
    for i in range(len(layers)):
        mine_t = torch.cat([token_errors(torch.cat(p), r) for p, r in zip(ours[i], refs[i])])
        theirs_t = torch.cat([token_errors(e, r) for e, r in zip(eager[i], refs[i])])
        excess = mine_t - RATIO * theirs_t - floor  # token by token: a wrong decode stands out
        t = int(excess.nan_to_num(float("inf")).argmax())
        mine, theirs = float(mine_t[t]), float(theirs_t[t])
        if float(mine_t.max()) > worst:
            worst, worst_layer = float(mine_t.max()), i
        theirs_worst = max(theirs_worst, float(theirs_t.max()))
        if not mine <= RATIO * theirs + floor:  # also catches NaN
            raise SeamSelfTestError(
                f"layer outputs through speculant's paged attention (backend {runner.backend.name!r}) differ from "
                f"transformers' own '{used}' attention's by more than {_dtype_name(dtype)} rounding explains: at "
                f"layer {i}, on the same input, the engine's token {t} is off a {_dtype_name(ref_dtype)} reference "
                f"by {mine:.3g} (relative error), transformers' by {theirs:.3g} (allowed {RATIO:g}x that "
                f"+ {floor:g}): the model does something in or around attention that the seam does not implement, "
                "or that backend is wrong for it (model.attention_backend = 'torch' selects the reference backend)")
    return SelfTestResult(worst, theirs_worst, worst_layer)


def _logits_test(runner, seam_name: str, seqs: list[list[int]]) -> SelfTestResult:
    """Whole-model logits against transformers' own attention (models without a layer list)."""
    model, device = runner.model, runner.device
    pieces: list[list[torch.Tensor]] = [[] for _ in seqs]

    def keep(spans: Forward, logits) -> None:
        offset = 0
        for i, span in spans:
            pieces[i].append(logits[offset: offset + span.num_tokens])
            offset += span.num_tokens

    _engine_forwards(runner, seqs, keep)
    used = _swap_to_reference(model)
    try:
        refs = [_reference_logits(model, s, device) for s in seqs]
    finally:
        model.set_attn_implementation(seam_name)
    deviation = 0.0
    for got, ref in zip((torch.cat(p) for p in pieces), refs):
        scale = max(1.0, float(ref.abs().max()))
        deviation = max(deviation, float((got - ref).abs().max()) / scale)
    limit = TOLERANCE.get(model.dtype, 1e-3)
    if not deviation <= limit:  # also catches NaN
        raise SeamSelfTestError(
            f"logits through speculant's paged attention (backend {runner.backend.name!r}) differ from "
            f"transformers' own '{used}' attention by {deviation:.3g} of their scale (allowed {limit:g} in "
            f"{_dtype_name(model.dtype)}): the model does something in or around attention that "
            "the seam does not implement, or that backend is wrong for it (model.attention_backend = 'torch' "
            "selects the reference backend)")
    return SelfTestResult(deviation, None)
