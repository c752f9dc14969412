"""Lossless sampling with the prompt's KV read from the prefix cache.

The same statistical test as ``test_spec_lossless.py`` (its tiny 16-token
llama, its draft, its exact marginals and chi-square bound), but every sampled
request finds most of its prompt already cached: the cache is warmed first by
one request whose prompt shares the first blocks and then diverges inside a
block, then by one with the same prompt (which reuses the shared blocks), both
sampled, so blocks of a different continuation sit in the pool next to the
right ones. Then the
N requests run in one batch with ``cache.block_size = 4``. The metrics must
show every request skipping all its full cached blocks, and the outputs must
follow the target's marginals given the prompt at every position.

Power: a cache that served the diverging prompt's KV would make the output
follow that prompt's marginals; the same test at the same N rejects those
(p < 1e-6) for the first output token. Measured while writing this: keying
blocks on their first two tokens only (so the diverging prompt's 4th block
is served to this prompt) fails all three cases at p = 0 on output token 0.
"""

from __future__ import annotations

import pytest
import test_spec_lossless as base
import torch
from test_spec_lossless import CASES, MAX_TOKENS, PROPOSER_OPTIONS, K, N, assert_follows_marginals, chi_square_p

from spec_helpers import run
from speculant import LLM, SamplingParams

small_vocab = base.small_vocab  # the same module-scoped fixture: target, draft, prompts

BLOCK = 4


def other_prompt(prompt: list[int]) -> list[int]:
    """Shares the first 3 blocks and 2 tokens of the 4th with ``prompt``, then differs at every position."""
    keep = 3 * BLOCK + 2
    return prompt[:keep] + [(t + 5) % 16 for t in prompt[keep:]]


@pytest.mark.parametrize("case", ["draft_full", "ngram_one_hot", "suffix_one_hot"])
def test_rejection_sampling_is_lossless_on_cached_prefixes(case, small_vocab):
    target, draft, prompts = small_vocab
    proposer, sampling = CASES[case]
    prompt = prompts["ngram"]  # 32 tokens: 7 full blocks cached, the 4th shared with ``other`` only in part
    other = other_prompt(prompt)
    assert other[:14] == prompt[:14] and all(a != b for a, b in zip(other[14:], prompt[14:], strict=True))
    options = PROPOSER_OPTIONS[proposer] if proposer != "draft_model" else {"model": str(draft)}
    llm = LLM(model=str(target), max_num_seqs=1024, max_num_batched_tokens=1024 * (len(prompt) + 1),
              block_size=BLOCK, enable_prefix_caching=True,
              speculative={"proposer": proposer, "proposer_options": options, "acceptance": "rejection",
                           "num_speculative_tokens": K})
    warm = SamplingParams(seed=10_000, max_tokens=MAX_TOKENS, ignore_eos=True, **sampling)
    run(llm, [other], warm)  # first, so a cache keyed too coarsely would serve its blocks to ``prompt``
    run(llm, [prompt], warm)
    before = llm.get_metrics()

    params = [SamplingParams(seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, **sampling) for i in range(N)]
    outs = run(llm, [prompt] * N, params)
    tokens = torch.tensor([o.outputs[0].token_ids for o in outs])  # [N, MAX_TOKENS]
    assert tokens.shape == (N, MAX_TOKENS)

    m = llm.get_metrics()
    cached_per_request = (len(prompt) - 1) // BLOCK  # full blocks before the always-computed last token
    hit_blocks = m["prefix_cache_hit_blocks"] - before["prefix_cache_hit_blocks"]
    assert hit_blocks == N * cached_per_request, (hit_blocks, N, cached_per_request)
    assert m["num_accepted_tokens"] - before["num_accepted_tokens"] >= 100
    assert_follows_marginals(tokens, base.marginals(target, prompt, params[0]), f"{case} on cached prefixes")

    wrong = base.next_token_probs(target, torch.tensor([other]), params[0])[0, -1]  # [V]
    assert chi_square_p(torch.bincount(tokens[:, 0], minlength=16), wrong) < 1e-6, \
        "the test cannot tell the diverging prompt's KV apart"
