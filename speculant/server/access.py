"""API keys (``--api-key``, ``SPECULANT_API_KEY``): ``Authorization: Bearer <key>``.

``ApiKeyAuth`` is a plain ASGI middleware in front of the routes. It reads
the request's headers only, so a request without a valid key is answered 401
(OpenAI's error shape, ``code: invalid_api_key``, ``WWW-Authenticate:
Bearer``) before its body is read or parsed, and never reaches the engine.
Every path needs a key except ``/health`` (for readiness probes and load
balancers) and, with ``--metrics-public``, ``/metrics``.

Keys are compared in constant time: the key sent and every accepted key are
hashed with SHA-256 and the digests compared with ``hmac.compare_digest``
(equal lengths, so the time tells nothing about a key's length), and every
accepted key is compared, so the time does not tell which one matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from speculant.server.errors import APIError

OPEN_PATHS = frozenset({"/health"})

_HOW = ("send the header 'Authorization: Bearer <key>' with a key the server was started with (--api-key or "
        "SPECULANT_API_KEY); with the openai client, pass api_key=<key>")


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, keys: Sequence[str], metrics_public: bool = False) -> None:
        if not keys:
            raise ValueError("ApiKeyAuth needs at least one key")
        self.app = app
        self._digests = [_digest(k.encode()) for k in keys]
        self.open_paths = OPEN_PATHS | ({"/metrics"} if metrics_public else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        problem = self.problem(scope)
        if problem is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "invalid API key"})
        else:
            error = APIError(401, problem, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await error.response()(scope, receive, send)

    def problem(self, scope: Scope) -> str | None:
        """Why the request's credentials are refused; None if they are accepted."""
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        if not values:
            return f"this server requires an API key and the request has no Authorization header; {_HOW}"
        scheme, _, token = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer":  # its value is not echoed: it may be a key sent without the scheme
            return f"the Authorization header does not start with 'Bearer '; {_HOW}"
        sent = _digest(token.strip())
        accepted = False
        for digest in self._digests:  # no early exit: the time does not tell which key matched
            accepted |= hmac.compare_digest(sent, digest)
        if not accepted:
            return f"the API key sent is not one this server accepts; {_HOW}"
        return None
