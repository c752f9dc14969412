"""Lay a step's batch out as query spans and split the logits back.

The flat layout is the engine's plain forward: each prefill chunk is one
multi-token span (logits only at its last token, and only when it reports:
samples, or ends a recompute one token short),
each decode one span ``[last, p1..pk]`` with logits at every position (a
token tree: ``[last, nodes...]``, each node at its depth's position and seeing
only its ancestors, ``interfaces.tree``). Scorers
may lay decodes out differently; they all reuse ``prefill_spans`` and
``gather_scores`` so results map back the same way. Part of the contract:
the built-in scorers use it, and so may a plugin's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speculant.interfaces.data import Proposals, QuerySpan, Scores
from speculant.interfaces.tree import depths, span_ancestor_mask

if TYPE_CHECKING:
    from speculant.interfaces.batch import ScheduledRequest, StepBatch
    from speculant.interfaces.sequence import SequenceHandle
    from speculant.interfaces.views import ForwardResult, RunnerView


def sequence(entry: ScheduledRequest) -> SequenceHandle:
    """The entry's sequence on the target's runner this step (what its spans name)."""
    if entry.sequence is None:
        raise ValueError(f"scheduled request {entry.request_id!r} carries no sequence handle: a batch is "
                         "scored only inside the engine's step, which issues one per request")
    return entry.sequence


def prefill_spans(runner: RunnerView, batch: StepBatch) -> list[QuerySpan]:
    return [
        QuerySpan(sequence(p), p.start, p.new_token_ids, [p.num_new_tokens - 1] if p.reports else [])
        for p in batch.prefills
    ]


def decode_tokens(batch: StepBatch, proposals: Proposals) -> list[list[int]]:
    """Each decode's last token followed by its proposals (one host copy)."""
    return [[d.request.token_ids[-1]] + row for d, row in zip(batch.decodes, proposals.to_lists())]


def flat_decode_spans(runner: RunnerView, batch: StepBatch, proposals: Proposals) -> list[QuerySpan]:
    spans = []
    parents = proposals.parents_lists()
    for i, (d, tokens) in enumerate(zip(batch.decodes, decode_tokens(batch, proposals))):
        span = QuerySpan(sequence(d), d.start, tokens, list(range(len(tokens))))
        if parents is not None and len(tokens) > 2:  # a tree (one node is a chain)
            span.positions = [d.start] + [d.start + depth for depth in depths(parents[i])]
            span.ancestor_mask = span_ancestor_mask(parents[i])
        spans.append(span)
    return spans


def gather_scores(out: ForwardResult, batch: StepBatch, proposals: Proposals) -> Scores:
    """Split a forward's logits (prefill rows first, then 1 + lens[i] rows per
    decode, in batch order) into ``Scores``: the decode rows are already in
    ``Scores``' flat order, so this slices, it never copies or pads."""
    logits = out.logits  # [R, V]
    num_prefill_rows = sum(1 for p in batch.prefills if p.reports)
    num_decode_rows = len(batch.decodes) + proposals.num_draft_tokens
    assert logits.shape[0] == num_prefill_rows + num_decode_rows, \
        "forward returned an unexpected number of logit rows"
    hidden = out.hidden_states
    prompt_rows = sum(p.num_new_tokens for p in batch.prefills)  # prefill spans come first in every layout
    return Scores(
        prefill_logits=logits[:num_prefill_rows],
        decode_logits=logits[num_prefill_rows:],
        cu_num_logits=proposals.cu_num_logits().to(logits.device),
        prefill_hidden=hidden[:num_prefill_rows] if hidden is not None else None,
        decode_hidden=hidden[num_prefill_rows:] if hidden is not None else None,
        prompt_hidden=out.token_hidden[:prompt_rows] if out.token_hidden is not None else None,
    )


def score_flat(runner: RunnerView, batch: StepBatch, proposals: Proposals, want_hidden: bool = False) -> Scores:
    spans = prefill_spans(runner, batch) + flat_decode_spans(runner, batch, proposals)
    return gather_scores(runner.forward(spans, want_hidden), batch, proposals)
