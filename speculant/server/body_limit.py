"""``--max-request-bytes``: a request body over the limit is 413, never read whole.

``BodyLimit`` is a plain ASGI middleware in front of the routes. A request
whose ``Content-Length`` is over the limit is answered 413 at once, without
calling the app, so none of its body is read into the process. A body
without one (``Transfer-Encoding: chunked``) is counted as the app reads it:
the chunk that crosses the limit is not passed on; the middleware answers 413
itself and tells the app the client has gone (``http.disconnect``, which
Starlette's body reader raises as ``ClientDisconnect``), and drops whatever
the app then tries to send. So at most the limit is ever held in memory.
After the 413, uvicorn reads and discards whatever the client still sends,
so a client that writes its whole body before reading gets the answer
rather than a reset connection.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from speculant.server.errors import APIError

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20
"""4 MiB: a prompt of a million ASCII characters, or of half a million token ids, fits."""


def too_large(size: str, limit: int) -> APIError:
    return APIError(413, f"the request body is {size}, over this server's limit of {limit} bytes "
                         f"(--max-request-bytes {limit}); send a shorter prompt or fewer messages, or restart "
                         "the server with a larger --max-request-bytes", code="request_too_large")


def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # uvicorn refuses a malformed one; counting still applies
    return None


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes}: must be at least 1")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await too_large(f"{declared} bytes (its Content-Length)", self.max_bytes).response()(scope, receive, send)
            return
        await _Counted(self.app, self.max_bytes, scope, receive, send).run()


class _Counted:
    """One request whose body is counted as the app reads it."""

    def __init__(self, app: ASGIApp, max_bytes: int, scope: Scope, receive: Receive, send: Send) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.scope, self._receive, self._send = scope, receive, send
        self.seen = 0
        self.over = False  # the limit was crossed: the app only hears that the client left
        self.answered = False  # our 413 went out: the app's own answer is dropped
        self.started = False  # the app began a response (too late for a 413)

    async def run(self) -> None:
        await self.app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.over:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] != "http.request":
            return message
        self.seen += len(message.get("body", b""))
        if self.seen <= self.max_bytes:
            return message
        self.over = True
        if not self.started:
            self.answered = True
            error = too_large(f"over {self.max_bytes} bytes ({self.seen} received so far)", self.max_bytes)
            await error.response()(self.scope, self._receive, self._send)
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.answered:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
