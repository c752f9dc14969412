"""Lay a step's batch out as query spans and split the logits back.

The flat layout is the engine's plain forward: each prefill chunk is one
multi-token span (logits only at its last token, and only when it reports:
samples, or ends a recompute one token short),
each decode one span ``[last, p1..pk]`` with logits at every position. Scorers
may lay decodes out differently; they all reuse ``prefill_spans`` and
``gather_scores`` so results map back the same way.
"""

from __future__ import annotations

from speculant.core.attention.base import QuerySpan
from speculant.core.batch import ScheduledRequest, StepBatch
from speculant.core.model_runner import ForwardOutput, ModelRunner
from speculant.proposers.base import Proposals
from speculant.scorers.base import Scores


def block_table(runner: ModelRunner, entry: ScheduledRequest) -> list[int]:
    return runner.block_manager.block_table(entry.request.request_id)


def prefill_spans(runner: ModelRunner, batch: StepBatch) -> list[QuerySpan]:
    return [
        QuerySpan(block_table(runner, p), p.start, p.new_token_ids, [p.num_new_tokens - 1] if p.reports else [])
        for p in batch.prefills
    ]


def decode_tokens(entry: ScheduledRequest, proposals: Proposals, row: int) -> list[int]:
    """The decode's last token followed by its proposals."""
    return [entry.request.token_ids[-1]] + proposals.row(row)


def flat_decode_spans(runner: ModelRunner, batch: StepBatch, proposals: Proposals) -> list[QuerySpan]:
    spans = []
    for i, d in enumerate(batch.decodes):
        tokens = decode_tokens(d, proposals, i)
        spans.append(QuerySpan(block_table(runner, d), d.start, tokens, list(range(len(tokens)))))
    return spans


def gather_scores(out: ForwardOutput, batch: StepBatch, proposals: Proposals) -> Scores:
    """Split a forward's logits (prefill rows first, then 1 + lens[i] rows per
    decode, in batch order) into ``Scores``."""
    logits = out.logits  # [R, V]
    num_prefill_rows = sum(1 for p in batch.prefills if p.reports)
    lens = proposals.lens.tolist()
    k_max = proposals.token_ids.shape[1]
    n, vocab = len(batch.decodes), logits.shape[-1]
    decode_logits = logits.new_zeros(n, k_max + 1, vocab)
    hidden = out.hidden_states
    decode_hidden = hidden.new_zeros(n, k_max + 1, hidden.shape[-1]) if hidden is not None else None
    row = num_prefill_rows
    for i, length in enumerate(lens):
        decode_logits[i, : length + 1] = logits[row: row + length + 1]
        if hidden is not None:
            decode_hidden[i, : length + 1] = hidden[row: row + length + 1]
        row += length + 1
    assert row == logits.shape[0], "forward returned an unexpected number of logit rows"
    return Scores(
        prefill_logits=logits[:num_prefill_rows],
        decode_logits=decode_logits,
        prefill_hidden=hidden[:num_prefill_rows] if hidden is not None else None,
        decode_hidden=decode_hidden,
    )


def score_flat(runner: ModelRunner, batch: StepBatch, proposals: Proposals, want_hidden: bool = False) -> Scores:
    spans = prefill_spans(runner, batch) + flat_decode_spans(runner, batch, proposals)
    return gather_scores(runner.forward(spans, want_hidden), batch, proposals)

