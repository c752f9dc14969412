"""Load-time self-test: the paged path must reproduce the model's own attention.

The probe (``attention/seam_probe.py``) refuses every feature it can see in the
attention function's arguments; this is the backstop for what it cannot see,
such as a model that post-processes attention output, ignores ``position_ids``
or mixes tokens outside attention. Two short sequences run through the engine's
path (a mixed batch: a prefill chunk of each, then a multi-token continuation
and a single-token decode over their cached prefixes) and through transformers'
own ``eager`` attention one sequence at a time; their logits must agree to
within the rounding noise of the dtype, or the model is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from speculant.interfaces import QuerySpan

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# max |ours - transformers| / max(1, max |logit|); float32 noise measured on the
# architecture matrix is ~1e-6, a real fault (wrong position, missing K/V,
# bidirectional layer) is O(0.1-10)
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}
_LENGTHS = (7, 6)  # sequence A: 4 + 3 tokens; sequence B: 5 + 1 token
_SPLITS = (4, 5)


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


@torch.inference_mode()
def seam_self_test(runner, seam_name: str) -> float:
    """Run the test on ``runner`` (a ModelRunner with caches allocated); return
    the relative deviation, raise :class:`SeamSelfTestError` if it is too large."""
    manager, model, device = runner.block_manager, runner.model, runner.device
    gen = torch.Generator().manual_seed(0)
    room = min(runner.max_model_len, manager.num_blocks * manager.block_size)
    lengths = [min(n, room) for n in _LENGTHS]
    seqs = [torch.randint(0, runner.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    if manager.num_blocks_for(lengths[0]) + manager.num_blocks_for(lengths[1]) > manager.num_free_blocks:
        seqs = seqs[:1]  # a pool this small holds one test sequence at a time
    names = [f"__speculant_self_test_{i}__" for i in range(len(seqs))]
    pieces: list[list[torch.Tensor]] = [[] for _ in seqs]  # per sequence, its logits in order
    try:
        tables = [manager.allocate(n, len(s)) for n, s in zip(names, seqs)]
        forwards: list[list[tuple[int, QuerySpan]]] = [[], []]  # (sequence, span) per forward
        for i, (seq, table, split) in enumerate(zip(seqs, tables, _SPLITS)):
            split = min(split, len(seq) - 1) if len(seq) > 1 else 1
            forwards[0].append((i, QuerySpan(table, 0, seq[:split], list(range(split)))))
            if split < len(seq):
                rest = seq[split:]
                forwards[1].append((i, QuerySpan(table, split, rest, list(range(len(rest))))))
        for spans in filter(None, forwards):
            logits, offset = runner.forward([s for _, s in spans]).logits, 0
            for i, span in spans:
                pieces[i].append(logits[offset: offset + span.num_tokens])
                offset += span.num_tokens
    finally:
        for n in names:
            if manager.has(n):
                manager.free(n)
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
            f"{str(model.dtype).removeprefix('torch.')}): the model does something in or around attention that "
            "the seam does not implement, or that backend is wrong for it (model.attention_backend = 'torch' "
            "selects the reference backend)")
    return deviation
