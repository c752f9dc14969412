"""Prefix caching across the architecture matrix: prompts that share prefixes
at a block boundary and inside a block, run one after another so later ones
start from cached blocks, equal transformers' greedy output token for token
(float32) with caching on, with and without speculation (issue 31).

The default run walks three architectures; ``-m slow`` every verified one."""

from __future__ import annotations

import pytest
from test_arch_matrix import DEFAULT_BACKEND

from arch_zoo import VERIFIED, random_prompts
from greedy_compare import check_all_greedy
from speculant import LLM, SamplingParams

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
BLOCK = 4
DEFAULT_ARCHS = ("llama", "qwen2", "gemma2")


def shared_prefix_prompts() -> list[list[int]]:
    """A 13-token base (3 full blocks of 4 and one token), then prompts sharing its
    first 8 tokens (a block boundary), its first 10 (inside a block), all of it plus
    more, and the base again (a hit up to the last prompt token)."""
    base, tail_a, tail_b, tail_c = random_prompts([13, 5, 6, 7], seed=5)
    return [base, base[:8] + tail_a, base[:10] + tail_b, base + tail_c, list(base)]


def _cells():
    for arch in VERIFIED:
        for spec in ("none", "ngram"):
            marks = () if arch in DEFAULT_ARCHS else (pytest.mark.slow,)
            yield pytest.param(arch, spec, marks=marks, id=f"{arch}-{spec}")


@pytest.mark.parametrize("arch,spec", list(_cells()))
def test_cached_prefixes_match_transformers(arch, spec, zoo, hf_reference):
    model_dir = zoo(arch)
    kw = {"speculative": {"proposer": "ngram", "num_speculative_tokens": 3}} if spec == "ngram" else {}
    llm = LLM(str(model_dir), attention_backend=DEFAULT_BACKEND, block_size=BLOCK, max_num_batched_tokens=64,
              enable_prefix_caching=True, **kw)
    prompts = shared_prefix_prompts()
    ours = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]  # one at a time
    refs = [hf_reference(model_dir).greedy(p, MAX_TOKENS) for p in prompts]
    assert len(ours) == len(refs) == len(prompts)
    check_all_greedy(ours, refs, f"{arch}/prefix-caching/{spec}")
    metrics = llm.get_metrics()
    assert metrics["prefix_caching"] is True
    assert metrics["prefix_cache_hit_tokens"] >= 8 + 8 + 12 + 12, metrics  # 2 + 2 + 3 + 3 cached blocks
