"""Seeded sampling gives the same tokens alone and when preempted, with every proposer.

docs/ARCHITECTURE.md promises that batch composition and preemption do not
change sampled tokens. With speculation, which random draw decides the token
at an output position depends on where the request's steps begin, so a
preempted request must resume with the step boundaries it would have had:
its recompute stops one token short and the last token is fed as a decode
(``Request.prefill_end``); a hidden-state proposer gets the hidden state of that
recompute's last row. Before, a draft_model request drew its next token from
the target alone after each recompute, and 4 of these 6 outputs differed.
"""

from __future__ import annotations

import pytest

from conftest import make_llm
from speculant import SamplingParams
from tiny_models import random_prompts

PROMPTS = random_prompts([9, 14, 21, 26, 30, 12], seed=23)
PARAMS = [SamplingParams(temperature=1.0, top_p=0.95 if i % 2 else 1.0, seed=100 + i, max_tokens=24,
                         ignore_eos=True) for i in range(len(PROMPTS))]


@pytest.mark.parametrize("proposer", [None, "ngram", "draft_model", "medusa", "mlp_speculator", "eagle"])
def test_seeded_sampling_alone_equals_preempted_in_company(proposer, llama_dir, spec_noisy_draft_dir,
                                                           random_heads_dirs):
    roomy = make_llm(llama_dir, proposer, spec_noisy_draft_dir, random_heads_dirs)
    alone = [roomy.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids for p, sp in zip(PROMPTS, PARAMS)]
    tight = make_llm(llama_dir, proposer, spec_noisy_draft_dir, random_heads_dirs, num_blocks=16)
    outs = tight.generate(PROMPTS, PARAMS, use_tqdm=False)
    preempted = [o.metrics["num_preemptions"] for o in outs]
    assert sum(preempted) >= 3, f"the tiny pool was meant to preempt: {preempted}"
    if proposer is not None:
        assert tight.get_metrics()["num_draft_tokens"] > 0
    differ = [i for i, (o, a) in enumerate(zip(outs, alone)) if o.outputs[0].token_ids != a]
    assert not differ, f"outputs {differ} changed under preemption (preemptions {preempted})"
