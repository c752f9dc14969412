"""How many API requests this server holds right now, from arrival to the last byte of the answer.

``OpenRequests`` is a plain ASGI middleware, added last so it runs first: a
request to a ``/v1/`` path counts from the moment it reaches the app (before
its key is checked or its body read) until the app has sent the end of its
response, whatever happened in between (an error answer, a stream, the client
leaving). The engine's own count (``Admission.num_in_flight``) starts later
(once the body is parsed and the request admitted) and ends earlier (when the
engine finishes it, before the answer has left): a server that dies loses
what this count holds, which is the number a load balancer or a test of a
lost replica needs. ``/metrics`` shows it as ``speculant_requests_open``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class OpenRequestCount:
    """The counters the middleware keeps and the metrics read (one event loop: no lock needed)."""

    def __init__(self) -> None:
        self.value = 0  # open now
        self.arrived = 0  # ever


class OpenRequests:
    def __init__(self, app: ASGIApp, count: OpenRequestCount) -> None:
        self.app = app
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        self.count.value += 1
        self.count.arrived += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.count.value -= 1
