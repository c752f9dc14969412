"""Lossless sampling while speculation switches off and on mid-request: the
statistical test of ``test_spec_lossless.py`` (same 16-token llama, prompts,
N seeded requests, chi-square per output position against the target's exact
marginals) with a draft-length policy that turns each request's speculation
off and on from step to step, differently per request (as the adaptive
policy and ``SamplingParams.speculative`` do), and a quarter of the requests
turning it off for themselves."""

from __future__ import annotations

import pytest
import torch
from test_spec_lossless import (
    MAX_TOKENS,
    PROPOSER_OPTIONS,
    K,
    N,
    assert_follows_marginals,
    marginals,
    small_vocab,  # noqa: F401 - the shared fixture
)

from spec_helpers import run
from speculant import LLM, SamplingParams
from speculant.engine.draft_length import FixedDraftLength


class Switching(FixedDraftLength):
    """Request i drafts its ceiling on steps where (i + step) % 3 != 0, else nothing."""

    name = "switching"

    def lengths(self, decoding, ceilings, fixed, fixed_requests=()):
        self.step = getattr(self, "step", -1) + 1
        return {r.request_id: 0 if (int(r.request_id.rsplit("-", 1)[1]) + self.step) % 3 == 0
                else ceilings[r.request_id] for r in decoding}


@pytest.mark.parametrize("proposer", ["draft_model", "ngram"])
def test_switching_speculation_keeps_the_target_distribution(small_vocab, proposer):  # noqa: F811
    target, draft, prompts = small_vocab
    prompt = prompts[proposer]
    options = PROPOSER_OPTIONS[proposer] if proposer != "draft_model" else {"model": str(draft)}
    llm = LLM(model=str(target), max_num_seqs=1024, max_num_batched_tokens=1024 * (len(prompt) + 1),
              speculative={"proposer": proposer, "proposer_options": options, "acceptance": "rejection",
                           "num_speculative_tokens": K})
    llm.engine.draft_length = Switching(llm.config.speculative)
    params = [SamplingParams(seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=1.0,
                             speculative={"enabled": False} if i % 4 == 3 else None) for i in range(N)]
    outs = run(llm, [prompt] * N, params)
    tokens = torch.tensor([o.outputs[0].token_ids for o in outs])  # [N, MAX_TOKENS]
    assert tokens.shape == (N, MAX_TOKENS)
    m = llm.get_metrics()
    # the switch happened in both directions within requests, and both branches of the sampler ran
    switched = sum(o.metrics["num_off_steps"] > 0 and o.metrics["num_steps"] > 0 for o in outs)
    assert switched >= N // 4, switched
    assert all(o.metrics["num_steps"] == 0 for i, o in enumerate(outs) if i % 4 == 3)
    assert m["num_accepted_tokens"] >= 100 and m["num_draft_tokens"] - m["num_accepted_tokens"] >= 100, m
    assert_follows_marginals(tokens, marginals(target, prompt, params[0]), f"{proposer}, switching")
