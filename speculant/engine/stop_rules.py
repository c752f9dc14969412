"""Append sampled tokens to a request one by one, applying the stop rules.

A speculative step emits a run of tokens; EOS, stop token ids, stop strings,
``max_tokens`` and ``max_model_len`` are checked after each token, so a stop
inside the run truncates it there.

Stop strings are looked for in the request's incremental text
(``request.detokenizer``): after each token, only in the text that token added
(or changed: a character it completed) plus the ``max(len(stop)) - 1``
characters before it, so a stop string straddling tokens is found, and found at
its first occurrence, with O(1) decoding work per token. When one is found the
output is decoded once in full and cut at the stop string's first occurrence,
exactly as searching the full text after every token would.
"""

from __future__ import annotations

from speculant.engine.detokenizer import TextDecoder
from speculant.engine.request import Request, RequestStatus


def append_tokens(
    request: Request,
    token_ids: list[int],
    max_model_len: int,
    decoder: TextDecoder,
    logprobs: list[dict[int, float]] | None = None,
) -> int:
    """Append ``token_ids`` until a stop rule fires; return how many were kept."""
    kept = 0
    for j, tok in enumerate(token_ids):
        request.token_ids.append(tok)
        kept += 1
        if request.logprobs is not None and logprobs is not None:
            request.logprobs.append(logprobs[j])
        if _check_stop(request, tok, max_model_len, decoder):
            break
    return kept


def catch_up(request: Request, decoder: TextDecoder) -> str:
    """Feed the output tokens ``request.detokenizer`` has not seen; return the
    text they added or changed, with up to ``max(len(stop)) - 1`` characters before it."""
    old = request.detokenizer
    start = request.num_prompt_tokens + old.consumed
    if start == len(request.token_ids):
        return ""
    request.detokenizer = new = old.feed(request.token_ids[start:], decoder)
    hold = max((len(s) for s in request.params.stop), default=1) - 1
    return new.since(max(0, len(old.text) - hold))


def _check_stop(request: Request, tok: int, max_model_len: int, decoder: TextDecoder) -> bool:
    params = request.params
    # under a grammar, EOS is sampled only where the grammar is complete: it ends the output
    if (not params.ignore_eos or request.grammar is not None) and tok in request.eos_token_ids:
        return _finish(request, "stop", None)
    if tok in params.stop_token_ids:
        return _finish(request, "stop", tok)
    if params.stop:
        # every earlier token was checked, so a stop string in the full text ends in this tail
        tail = catch_up(request, decoder)
        if any(stop in tail for stop in params.stop):
            return _stop_string(request, decoder)
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return _finish(request, "length", None)
    return False


def _stop_string(request: Request, decoder: TextDecoder) -> bool:
    """Cut the output at the first stop string (in ``params.stop`` order) found in
    the full decode (once per request); the incremental text is the fallback
    for a tokenizer whose full decode disagrees with it."""
    params = request.params
    for text in (decoder(request.output_token_ids), request.detokenizer.full_text):
        for stop in params.stop:
            idx = text.find(stop)
            if idx != -1:
                cut = idx + len(stop) if params.include_stop_str_in_output else idx
                request.output_text = text[:cut]
                return _finish(request, "stop", stop)
    raise AssertionError("unreachable: a stop string was found in the incremental text")


def _finish(request: Request, reason: str, stop_reason) -> bool:
    request.status = RequestStatus.FINISHED
    request.finish_reason = reason
    request.stop_reason = stop_reason
    return True
