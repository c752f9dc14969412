"""What the bad-input tests share: one small engine, one valid greedy request
and its tokens, and the check that after a refusal the engine still returns
exactly those tokens and left nothing queued."""

from __future__ import annotations

from pathlib import Path

from speculant import LLM, SamplingParams
from tiny_models import random_prompts

GOOD_PROMPT = random_prompts([10], seed=41)[0]
GOOD_PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def small_llm(model_dir: Path) -> LLM:
    """A 4-token-block engine with a 16-token budget and 4 sequences, so
    chunking and queueing happen on short prompts."""
    return LLM(str(model_dir), block_size=4, max_num_batched_tokens=16, max_num_seqs=4)


def good_tokens(llm: LLM) -> list[int]:
    return llm.generate([GOOD_PROMPT], GOOD_PARAMS, use_tqdm=False)[0].outputs[0].token_ids


def assert_still_serving(llm: LLM, baseline: list[int]) -> None:
    assert not llm.engine.has_unfinished_requests(), "a refused request was left queued"
    assert good_tokens(llm) == baseline


def assert_words(message: str, *words: str) -> None:
    for w in words:
        assert w in message, f"{w!r} missing from the error message:\n{message}"
