"""Run one admitted request to its answer: a whole JSON body or an SSE stream.

Streaming sends one ``data:`` event per engine step that committed tokens
for the request (several tokens at once when speculation accepted a run),
the finish reason and speculation summary on the last one, an optional
usage chunk, then ``data: [DONE]``. A client that goes away (a closed
stream, or a dropped connection while a whole answer is computed) aborts
its request at once, which frees its KV blocks between steps. A request the
engine failed is a 500 naming the request and where it failed (mid-stream:
an ``error`` event, as OpenAI's own API sends, then ``[DONE]``).

The text itself was detokenized by the engine thread. Log-probabilities
are not: each token and each alternative is decoded with the tokenizer when
the reply is built, so with them the reply (and each event) is built in a
worker thread, off the event loop; without them it is a few dict entries.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from speculant.engine.request import RequestOutput
from speculant.server.admission import Admission, AsyncRequestStream
from speculant.server.errors import APIError, error_body
from speculant.server.metrics import ServerMetrics
from speculant.server.responses import Reply

DISCONNECT_POLL_S = 0.25
"""How often a non-streaming handler checks that its client is still there."""


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def failed(out: RequestOutput) -> APIError | None:
    c = out.outputs[0]
    if c.finish_reason != "error":
        return None
    return APIError(500, c.error or out.error or f"request {out.request_id!r} failed in the engine",
                    code="request_failed")


@dataclass
class Serving:
    """One request's path from the engine loop to its client."""

    loop: Admission
    metrics: ServerMetrics
    stream: AsyncRequestStream
    reply: Reply

    def __post_init__(self) -> None:
        self._recorded = False

    def cleanup(self) -> None:
        """After the response, however it ended (a stream closed before its first
        event never runs the generator's own cleanup)."""
        self._done(None)

    def _done(self, out: RequestOutput | None) -> None:
        if self._recorded:
            return
        self._recorded = True
        if out is None:  # the client went away (or the server stopped) first
            if not self.stream.finished:
                self.loop.abort(self.stream)
            self.metrics.finished("abort")
            return
        c = out.outputs[0]
        self.metrics.finished(c.finish_reason or "abort", len(out.prompt_token_ids), len(c.token_ids))

    async def whole(self, request: Request) -> dict[str, Any]:
        out = None
        try:
            out = await self._final(request)
        except ClientGone:
            raise APIError(499, "client closed the connection") from None
        except RuntimeError as exc:  # the server stopped under this request
            raise APIError(503, str(exc), code="shutting_down") from None
        finally:
            self._done(out)
        error = failed(out)
        if error is not None:
            raise error
        return await self._built(self.reply.whole, out)

    async def _built(self, build: Callable[..., Any], *args: Any) -> Any:
        """``build(*args)``, in a worker thread when it decodes log-probabilities."""
        if self.reply.num_logprobs is None:
            return build(*args)
        return await asyncio.to_thread(build, *args)

    async def _final(self, request: Request) -> RequestOutput:
        watcher = asyncio.create_task(self._watch(request))
        try:
            while not (out := await self.stream.next()).finished:
                pass
            return out
        finally:
            watcher.cancel()

    async def _watch(self, request: Request) -> None:
        """Wake ``_final`` with ClientGone once the client has hung up (a separate
        task, so no wait on the stream is ever cut short and no output lost)."""
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        self.stream.queue.put_nowait(ClientGone())

    async def events(self, include_usage: bool) -> AsyncIterator[str]:
        out: RequestOutput | None = None
        last: RequestOutput | None = None
        text_sent, tokens_sent = "", 0
        try:
            while last is None or not last.finished:
                last = await self.stream.next()
                error = failed(last)
                if error is not None:
                    yield sse(error.body())
                    break
                c = last.outputs[0]
                first = tokens_sent == 0 and not text_sent
                if len(c.token_ids) > tokens_sent or last.finished:
                    logprobs = c.logprobs[tokens_sent:] if c.logprobs is not None else None
                    yield sse(await self._built(self.reply.chunk, c.text[len(text_sent):], c.token_ids[tokens_sent:],
                                                logprobs, last if last.finished else None, first, len(text_sent)))
                    text_sent, tokens_sent = c.text, len(c.token_ids)
            out = last
            if include_usage and out is not None and failed(out) is None:
                yield sse(self.reply.usage_chunk(out))
            yield sse("[DONE]")
        except RuntimeError as exc:  # the server stopped under this request
            yield sse(error_body(503, str(exc)))
        finally:
            self._done(out)
