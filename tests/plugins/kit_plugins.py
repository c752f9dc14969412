"""One outside plugin of each kind, written as a third party would: nothing
from speculant but ``speculant.plugin_api`` (tests/plugins/test_conformance_kit.py
checks the imports and runs the conformance kit on each).

- ``BigramProposer`` keeps, per request in ``proposer_state``, a table of the
  token that last followed each token, extended as tokens arrive, and
  proposes by walking it (stateful: it must survive ``free`` and rebuild).
- ``TwoPassScorer`` runs the prefill chunks and the decodes in two forwards.
- ``CoinFlipAcceptance`` is speculative sampling written from its definition:
  keep proposal x with probability min(1, p(x) / q(x)), else draw from the
  residual max(0, p - q); then a bonus token from p.
"""

from __future__ import annotations

import torch

from speculant.plugin_api import (
    PLACEHOLDER_TOKEN_ID,
    AcceptanceCapabilities,
    AcceptanceMethod,
    AcceptedTokens,
    Proposals,
    Proposer,
    ProposerCapabilities,
    QuerySpan,
    Scorer,
    ScorerCapabilities,
    Scores,
    StepBatch,
    decode_tokens,
    prefill_spans,
)


class BigramProposer(Proposer):
    name = "kit-bigram"
    api_version = "3.0"
    capabilities = ProposerCapabilities(draft_probs="one_hot", supports_prefix_caching=True)

    def propose(self, batch: StepBatch) -> Proposals:
        rows = []
        for d in batch.decodes:
            ids = d.request.token_ids
            state = d.proposer_state
            follows: dict[int, int] = state.setdefault("follows", {})
            for i in range(max(1, state.get("indexed", 0)), len(ids)):
                follows[ids[i - 1]] = ids[i]
            state["indexed"] = len(ids)
            row, tok = [], ids[-1]
            while len(row) < d.num_spec_tokens and tok in follows:
                tok = follows[tok]
                row.append(tok)
            rows.append(row)
        return Proposals.from_lists(rows)


class TwoPassScorer(Scorer):
    name = "kit-two-pass"
    api_version = "3.0"
    capabilities = ScorerCapabilities(supports_mixed_prefill_decode=True, needs_multi_token_queries=True)

    def score(self, runner, batch: StepBatch, proposals: Proposals, want_hidden: bool = False) -> Scores:
        spans = prefill_spans(runner, batch)
        first = runner.forward(spans, want_hidden) if spans else None
        decode_spans = [QuerySpan(d.sequence, d.start, tokens, list(range(len(tokens))))
                        for d, tokens in zip(batch.decodes, decode_tokens(batch, proposals))]
        second = runner.forward(decode_spans, want_hidden) if decode_spans else None
        vocab = runner.vocab_size
        empty = torch.zeros(0, vocab)
        prefill_logits = first.logits if first is not None else empty
        decode_logits = second.logits if second is not None else empty.to(prefill_logits.device)
        return Scores(
            prefill_logits=prefill_logits, decode_logits=decode_logits,
            cu_num_logits=proposals.cu_num_logits().to(decode_logits.device),
            prefill_hidden=first.hidden_states if first is not None else None,
            decode_hidden=second.hidden_states if second is not None else None,
        )


class CoinFlipAcceptance(AcceptanceMethod):
    name = "kit-coin-flip"
    api_version = "3.0"
    capabilities = AcceptanceCapabilities(needs_draft_probs=False, lossless=True, supports_sampling=True)

    def accept(self, target_logprobs, draft_token_ids, cu_num_draft_tokens, draft_probs, greedy,
               generators) -> AcceptedTokens:
        cu = cu_num_draft_tokens.tolist()
        n = len(cu) - 1
        width = max(b - a for a, b in zip(cu[:-1], cu[1:])) + 1 if n else 1
        out = torch.full((n, width), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
        kept = torch.zeros(n, dtype=torch.long)
        p_all = target_logprobs.float().exp()  # [n + T, V]
        for i in range(n):
            a, b = cu[i], cu[i + 1]
            rows = p_all[a + i: b + i + 1]  # [1 + lens[i], V]: the target after each prefix
            emitted: list[int] = []
            for j, x in enumerate(draft_token_ids[a:b].tolist()):
                p = rows[j]
                q = draft_probs[a + j].float() if draft_probs is not None else \
                    torch.nn.functional.one_hot(torch.tensor(x), p.shape[0]).float()
                if bool(greedy[i]):
                    if int(p.argmax()) != x:
                        break
                elif torch.rand((), generator=generators[i]) >= torch.clamp(p[x] / q[x], max=1.0):
                    residual = torch.clamp(p - q, min=0.0)
                    emitted.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generators[i])))
                    break
                emitted.append(x)
            else:
                j = b - a
            if len(emitted) == j:  # every proposal so far kept: the bonus comes from the target's next row
                nxt = rows[j]
                emitted.append(int(nxt.argmax()) if bool(greedy[i]) else
                               int(torch.multinomial(nxt, 1, generator=generators[i])))
            kept[i] = len(emitted) - 1
            out[i, :len(emitted)] = torch.tensor(emitted)
        return AcceptedTokens(token_ids=out, num_accepted=kept)
