"""The engine's acceptance with a trained proposer on the held-out chat prompts."""

from __future__ import annotations

from eagle_training.chat_prompts import HELDOUT
from speculant import LLM, SamplingParams


def engine_acceptance(target: str, proposer: str, options: dict, k: int, max_tokens: int, dtype: str) -> dict:
    """Greedy generation of every ``HELDOUT`` prompt with ``proposer`` (its ``options``) at k."""
    llm = LLM(model=target, dtype=dtype, max_num_seqs=8, max_num_batched_tokens=1024,
              speculative={"proposer": proposer, "num_speculative_tokens": k, "proposer_options": options})
    llm.chat([[{"role": "user", "content": p}] for p in HELDOUT],
             SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    m = llm.get_metrics()
    return {"prompts": f"{len(HELDOUT)} held-out chat prompts (scripts/eagle_training/chat_prompts.py)",
            "dtype": dtype, "max_tokens": max_tokens, "num_speculative_tokens": k,
            "acceptance_rate": m["acceptance_rate"], "mean_accepted_length": m["mean_accepted_length"]}
