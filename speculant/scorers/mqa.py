"""MQA scorer: all proposals of a decode as one multi-token query.

Prefill chunks and decodes ``[last, p1..pk]`` go through the target in one
flattened forward; the attention backend must accept multi-token queries over
a cached prefix. A token tree is one span too: its nodes at their depths'
positions, each seeing only its ancestors (the backend's tree mask).
"""

from __future__ import annotations

from speculant.interfaces import Scorer, ScorerCapabilities, Scores
from speculant.interfaces.layout import score_flat


class MQAScorer(Scorer):
    name = "mqa"
    api_version = "3.0"
    capabilities = ScorerCapabilities(supports_mixed_prefill_decode=True, needs_multi_token_queries=True,
                                      verifies_trees=True)

    def score(self, runner, batch, proposals, want_hidden: bool = False) -> Scores:
        return score_flat(runner, batch, proposals, want_hidden)
