"""Response bodies in OpenAI's shapes, built from the engine's RequestOutputs.

``Reply`` knows whether it answers ``/v1/completions`` (``text_completion``,
``choices[].text``) or ``/v1/chat/completions`` (``chat.completion``,
``choices[].message`` / ``choices[].delta``). Log-probabilities are the
target's, from the distribution each token was drawn from (after
temperature, top-k, top-p and min-p; greedy rows: the plain softmax), for
every emitted token, accepted proposals included.

Extension: every finished response (and the last streamed chunk) carries
``speculant``, the request's speculation summary, and ``usage``, both from
``speculant.engine.output_record`` (the batch job's records carry the same).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from speculant.engine.output_record import OutputRecord, spec_summary, usage
from speculant.engine.request import RequestOutput


@dataclass
class Reply:
    """Builds one request's response, whole or as stream chunks."""

    chat: bool
    model: str
    request_id: str
    tokenizer: Any
    num_logprobs: int | None  # top alternatives per token; None: no log-probabilities
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.request_id

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, out: RequestOutput) -> dict[str, Any]:
        c = out.outputs[0]
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": c.text}
        else:
            choice["text"] = c.text
        choice["logprobs"] = self.logprobs(c.token_ids, c.logprobs)
        choice["finish_reason"] = c.finish_reason
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                **OutputRecord.of(out).summary()}

    def chunk(self, text: str, token_ids: list[int], logprobs: list[dict[int, float]] | None,
              out: RequestOutput | None, first: bool = False, text_offset: int = 0) -> dict[str, Any]:
        """One streamed event: the text and tokens this step added; with ``out``
        (finished) also the finish reason and the speculation summary."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = ({"role": "assistant", "content": text} if first else {"content": text}) \
                if (text or first) else {}
        else:
            choice["text"] = text
        choice["logprobs"] = self.logprobs(token_ids, logprobs, text_offset) if token_ids else None
        choice["finish_reason"] = out.outputs[0].finish_reason if out is not None else None
        body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if out is not None:
            body["speculant"] = spec_summary(out)
        return body

    def usage_chunk(self, out: RequestOutput) -> dict[str, Any]:
        """``stream_options.include_usage``: the last chunk, usage and no choices."""
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage(out)}

    # --- log-probabilities ------------------------------------------------------
    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None,
                 text_offset: int = 0) -> dict[str, Any] | None:
        if self.num_logprobs is None or entries is None:
            return None
        n = self.num_logprobs
        # each entry holds the top n (most likely first), then the chosen token if it is not among them
        tops = [list(e.items())[:n] for e in entries]
        if self.chat:
            return {"content": [self._chat_entry(t, e[t], top) for t, e, top in zip(token_ids, entries, tops)]}
        texts = [self._token(t) for t in token_ids]
        offsets, pos = [], text_offset
        for s in texts:
            offsets.append(pos)
            pos += len(s)
        return {"tokens": texts, "token_logprobs": [e[t] for t, e in zip(token_ids, entries)],
                "top_logprobs": [{self._token(i): lp for i, lp in top} for top in tops],
                "text_offset": offsets}

    def _chat_entry(self, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
        text = self._token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")),
                "top_logprobs": [{"token": (s := self._token(i)), "logprob": lp, "bytes": list(s.encode("utf-8"))}
                                 for i, lp in top]}
