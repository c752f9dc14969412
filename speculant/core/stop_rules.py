"""Append sampled tokens to a request one by one, applying the stop rules.

A speculative step emits a run of tokens; EOS, stop token ids, stop strings,
``max_tokens`` and ``max_model_len`` are checked after each token, so a stop
inside the run truncates it there.
"""

from __future__ import annotations

from typing import Callable

from speculant.core.request import Request, RequestStatus


def append_tokens(
    request: Request,
    token_ids: list[int],
    max_model_len: int,
    detokenize: Callable[[list[int]], str],
    logprobs: list[dict[int, float]] | None = None,
) -> int:
    """Append ``token_ids`` until a stop rule fires; return how many were kept."""
    kept = 0
    for j, tok in enumerate(token_ids):
        request.token_ids.append(tok)
        kept += 1
        if request.logprobs is not None and logprobs is not None:
            request.logprobs.append(logprobs[j])
        if _check_stop(request, tok, max_model_len, detokenize):
            break
    return kept


def _check_stop(request: Request, tok: int, max_model_len: int, detokenize) -> bool:
    params = request.params
    if not params.ignore_eos and tok in request.eos_token_ids:
        return _finish(request, "stop", None)
    if tok in params.stop_token_ids:
        return _finish(request, "stop", tok)
    if params.stop:
        text = detokenize(request.output_token_ids)
        for stop in params.stop:
            # checked after every token, so the first occurrence ends the request
            idx = text.find(stop)
            if idx != -1:
                cut = idx + len(stop) if params.include_stop_str_in_output else idx
                request.output_text = text[:cut]
                return _finish(request, "stop", stop)
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return _finish(request, "length", None)
    return False


def _finish(request: Request, reason: str, stop_reason) -> bool:
    request.status = RequestStatus.FINISHED
    request.finish_reason = reason
    request.stop_reason = stop_reason
    return True
