"""transformers continuous batching for ``speculant bench`` (concurrency > 1).

transformers 5.x serves many requests through a paged-attention manager
(``model.generate_batch`` / ``model.continuous_batching_context_manager``):
a background thread schedules prefill and decode tokens of all queued
requests into each forward, which is the transformers counterpart of
Speculant's scheduler. The row here uses one manager per concurrency level:
a short untimed warm-up, then ``repeats`` timed runs of all requests added at
once; greedy, EOS off (``eos_token_id = -1``), the same ``max_new_tokens`` for
every request. The step token budget equals Speculant's
(``scheduler.max_num_batched_tokens``).

When the installed transformers has no continuous batching (no
``ContinuousBatchingConfig``, or a model without
``continuous_batching_context_manager``), ``CBUnsupported`` says so and the
caller records ``status: "unsupported: <reason>"``. Anything that goes wrong
once it exists (an exception in transformers, a stopped or stalled manager, a
failed request, lengths other than ``max_new_tokens``) is an error, not a
missing feature: it propagates (``CBFailed`` for the checks made here) and
the caller records ``status: "error: <type>: <message>"``.
Assisted generation has no such row: ``generate_batch`` refuses an assistant
model.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from speculant.bench.report import median

PAGE_SIZE = 256  # tokens per KV page: the transformers default
STALL_S = 300.0  # no finished request for this long: give up on the row


class CBUnsupported(RuntimeError):
    """The installed transformers has no continuous batching; the message is the reason."""


class CBFailed(RuntimeError):
    """Continuous batching exists but did not produce the requested tokens; the message says how."""


def _configs(model, requests: list[list[int]], max_tokens: int, max_batch_tokens: int, pad_id: int | None):
    try:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError as exc:
        raise CBUnsupported(f"this transformers has no continuous batching ({exc}); it needs transformers "
                            ">= 5 (pip install -U transformers)") from None
    if not hasattr(model, "continuous_batching_context_manager"):
        raise CBUnsupported("the model has no continuous_batching_context_manager (generate_batch); it needs "
                            "transformers >= 5 (pip install -U transformers)")
    blocks = 4 + sum(-(-(len(p) + max_tokens) // PAGE_SIZE) for p in requests)
    cb_cfg = ContinuousBatchingConfig(page_size=PAGE_SIZE, num_blocks=blocks, max_batch_tokens=max_batch_tokens,
                                      max_requests_per_batch=len(requests), allow_block_sharing=False)
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, eos_token_id=-1,  # -1: EOS off
                               pad_token_id=pad_id)
    return cb_cfg, gen_cfg


def _run_all(mgr, requests: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Add every request, wait for all; generated token ids in request order."""
    ids = [mgr.add_request(p, max_new_tokens=max_tokens) for p in requests]
    done: dict[str, Any] = {}
    last = time.perf_counter()
    while len(done) < len(ids):
        r = mgr.get_result(timeout=5)
        if r is None:
            if not mgr.is_running():
                raise CBFailed("the continuous batching thread stopped before every request finished")
            if time.perf_counter() - last > STALL_S:
                raise CBFailed(f"no request finished for {STALL_S:.0f} s")
            continue
        if r.is_finished():
            if getattr(r, "error", None) is not None:
                raise CBFailed(f"a request failed: {r.error}")
            done[r.request_id] = r
            last = time.perf_counter()
    return [list(done[i].generated_tokens) for i in ids]


def run_continuous_batching(model, requests: list[list[int]], max_tokens: int, repeats: int,
                            max_batch_tokens: int, pad_id: int | None) -> dict[str, Any]:
    """Row fields (tokens/s median over ``repeats``, ``token_ids``); ``CBUnsupported`` when this
    transformers has no continuous batching, any other exception when it fails."""
    cb_cfg, gen_cfg = _configs(model, requests, max_tokens, max_batch_tokens, pad_id)
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)  # psutil/CPU warnings
    rates: list[float] = []
    token_ids: list[list[int]] = []
    attn = "?"
    with model.continuous_batching_context_manager(generation_config=gen_cfg, continuous_batching_config=cb_cfg,
                                                   block=True, timeout=60) as mgr:
        attn = getattr(model.config, "_attn_implementation", None) or "?"
        _run_all(mgr, requests[:2], min(4, max_tokens))  # untimed warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            token_ids = _run_all(mgr, requests, max_tokens)
            secs = time.perf_counter() - t0
            rates.append(sum(len(t) for t in token_ids) / secs if secs > 0 else 0.0)
    lengths = sorted({len(t) for t in token_ids})
    if lengths != [max_tokens]:
        raise CBFailed(f"generated lengths {lengths} differ from max_new_tokens={max_tokens} "
                       "(EOS could not be switched off)")
    return {"num_requests": len(requests), "num_tokens": sum(len(t) for t in token_ids),
            "tokens_per_s": median(rates), "tokens_per_s_samples": [round(r, 2) for r in rates],
            "itl_p50_ms": None, "itl_p99_ms": None, "token_ids": token_ids,
            "note": f"generate_batch: paged KV, {max_batch_tokens}-token steps, {attn} attention"}
