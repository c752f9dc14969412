"""Batch-expansion scorer: each decode becomes k+1 single-token rows.

Row j of a decode feeds token j of ``[last, p1..pk]`` at its own position and
names the request's sequence. All rows of a forward write their K/V before
any row attends, so row j sees the K/V its siblings wrote for positions before
it. Prefill chunks stay multi-token spans, as in MQA, in the same forward.
"""

from __future__ import annotations

from speculant.interfaces import QuerySpan, Scorer, ScorerCapabilities, Scores
from speculant.interfaces.layout import decode_tokens, gather_scores, prefill_spans, sequence


class BatchExpansionScorer(Scorer):
    name = "batch_expansion"
    api_version = "3.0"
    capabilities = ScorerCapabilities(
        supports_mixed_prefill_decode=True, needs_multi_token_queries=False, verifies_trees=False,
        no_trees_reason=("its expanded rows share the request's sequence and write K/V at start + j, so "
                         "siblings at one depth would collide on one slot"))

    def score(self, runner, batch, proposals, want_hidden: bool = False) -> Scores:
        spans = prefill_spans(runner, batch)
        for d, tokens in zip(batch.decodes, decode_tokens(batch, proposals)):
            seq = sequence(d)
            for j, tok in enumerate(tokens):
                spans.append(QuerySpan(seq, d.start + j, [tok], [0]))
        return gather_scores(runner.forward(spans, want_hidden), batch, proposals)
