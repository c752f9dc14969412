"""The two ASGI guards in front of the routes, in process: ``ApiKeyAuth`` answers
401 from the headers alone (the body is never read, the app never called),
compares the key sent with every configured key in constant time, and lets
/health, and /metrics with --metrics-public, through; ``BodyLimit`` answers
413 from Content-Length without reading the body, and stops a chunked body at
the limit (the app never holds more than that)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading

from fastapi.testclient import TestClient
from starlette.requests import ClientDisconnect, Request

from speculant.server.access import ApiKeyAuth
from speculant.server.app import ServerState, build_app
from speculant.server.body_limit import BodyLimit

KEYS = ("key-one", "key-two")


def _scope(path: str = "/v1/completions", headers: dict[str, str] | None = None) -> dict:
    return {"type": "http", "method": "POST", "path": path,
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}


def _call(middleware, scope: dict, chunks: list[bytes] | None = None) -> tuple[list[dict], dict]:
    """Run one request through ``middleware``; returns the messages sent and
    ``{"pulled": bytes read from the client, "app_called": ...}``."""
    sent: list[dict] = []
    seen = {"pulled": 0, "app_called": False}
    source = list(chunks if chunks is not None else [b""])

    async def receive() -> dict:
        if not source:
            return {"type": "http.disconnect"}
        chunk = source.pop(0)
        seen["pulled"] += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(source)}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent, seen


def _app(seen: dict):
    """An app that reads its whole body as Starlette does, then answers 200."""

    async def app(scope, receive, send):
        seen["app_called"] = True
        try:
            body = await Request(scope, receive).body()
        except ClientDisconnect:
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % len(body)})

    return app


def _status_and_error(sent: list[dict]) -> tuple[int, dict]:
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1, sent
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return starts[0]["status"], json.loads(body).get("error", {}) if body.startswith(b"{") else {}


def test_a_request_without_a_valid_key_is_401_from_its_headers_alone():
    seen = {"app_called": False}
    auth = ApiKeyAuth(_app(seen), KEYS)
    for headers, fragment in (({}, "no Authorization header"),
                              ({"Authorization": "Basic a2V5"}, "start with 'Bearer '"),
                              ({"Authorization": "Bearer key-on"}, "not one this server accepts"),
                              ({"Authorization": "Bearer key-one2"}, "not one this server accepts"),
                              ({"Authorization": "key-one"}, "start with 'Bearer '")):
        sent, pulled = _call(auth, _scope(headers=headers), [b"{}"] * 3)
        status, error = _status_and_error(sent)
        assert status == 401 and error["code"] == "invalid_api_key" and fragment in error["message"], error
        assert "--api-key" in error["message"] and "key-one" not in error["message"]
        assert (b"www-authenticate", b"Bearer") in sent[0]["headers"]
        assert pulled["pulled"] == 0 and not seen["app_called"]
    for key in KEYS:
        for scheme in ("Bearer", "bearer"):
            sent, _ = _call(auth, _scope(headers={"Authorization": f"{scheme} {key}"}), [b"{}"])
            assert _status_and_error(sent)[0] == 200


def test_keys_are_compared_in_constant_time(monkeypatch):
    """One ``hmac.compare_digest`` per configured key, whichever key matches
    (the first, the last, none): no early exit tells which key matched; and
    the SHA-256 digests are compared, never the keys, so every comparison is
    of 32 bytes with 32 whatever the keys' lengths."""
    calls: list[tuple[bytes, bytes]] = []
    compare = hmac.compare_digest

    def counted(a, b):
        calls.append((bytes(a), bytes(b)))
        return compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counted)
    keys = ("key-one", "key-two", "a-much-longer-third-key")
    digests = {hashlib.sha256(k.encode()).digest() for k in keys}
    auth = ApiKeyAuth(_app({}), keys)
    for sent_key, status in [(k, 200) for k in keys] + [("key-on", 401), ("x" * 200, 401)]:
        calls.clear()
        sent, _ = _call(auth, _scope(headers={"Authorization": f"Bearer {sent_key}"}), [b"{}"])
        assert _status_and_error(sent)[0] == status, sent_key
        assert len(calls) == len(keys), (sent_key, len(calls))
        assert {b for _, b in calls} == digests, sent_key  # every configured key, once each
        assert {a for a, _ in calls} == {hashlib.sha256(sent_key.encode()).digest()}, sent_key
        assert all(len(a) == len(b) == 32 for a, b in calls)


def test_health_is_open_and_metrics_only_with_metrics_public():
    seen: dict = {}
    for public, metrics_status in ((False, 401), (True, 200)):
        auth = ApiKeyAuth(_app(seen), KEYS, metrics_public=public)
        assert _status_and_error(_call(auth, _scope("/health"))[0])[0] == 200
        assert _status_and_error(_call(auth, _scope("/metrics"))[0])[0] == metrics_status
        assert _status_and_error(_call(auth, _scope("/health/x"))[0])[0] == 401


def test_a_declared_body_over_the_limit_is_413_unread():
    seen = {"app_called": False}
    sent, pulled = _call(BodyLimit(_app(seen), max_bytes=1000), _scope(headers={"Content-Length": "50000000"}),
                         [b"x" * 100] * 10)
    status, error = _status_and_error(sent)
    assert status == 413 and error["code"] == "request_too_large", error
    assert "50000000 bytes" in error["message"] and "--max-request-bytes 1000" in error["message"]
    assert pulled["pulled"] == 0 and not seen["app_called"]


def test_a_chunked_body_is_cut_at_the_limit():
    seen = {"app_called": False}
    chunks = [b"x" * 65536] * 800  # 50 MiB offered
    sent, pulled = _call(BodyLimit(_app(seen), max_bytes=4 * 2**20), _scope(), chunks)
    status, error = _status_and_error(sent)
    assert status == 413 and "over 4194304 bytes" in error["message"], error
    assert seen["app_called"] and pulled["pulled"] <= 4 * 2**20 + 65536


def test_a_body_within_the_limit_passes_whole():
    seen: dict = {}
    sent, _ = _call(BodyLimit(_app(seen), max_bytes=1000), _scope(headers={"Content-Length": "1000"}),
                    [b"x" * 500, b"y" * 500])
    assert _status_and_error(sent)[0] == 200 and sent[-1]["body"] == b"1000"


def test_the_app_runs_auth_before_the_body_limit_and_before_loading():
    """The real app, its model still loading: 401 before 413 before 503."""
    release = threading.Event()

    def load():
        release.wait(60)
        raise OSError("this test's model never loads")

    state = ServerState(load, "tiny", max_queued=4, api_keys=KEYS, max_request_bytes=100)
    with TestClient(build_app(state)) as client:
        big = {"prompt": "x" * 200}
        assert client.post("/v1/completions", json=big).status_code == 401
        assert client.get("/metrics").status_code == 401
        assert client.get("/health").status_code == 503
        auth = {"Authorization": "Bearer key-two"}
        assert client.post("/v1/completions", json=big, headers=auth).status_code == 413
        r = client.post("/v1/completions", json={"prompt": "x"}, headers=auth)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert client.get("/metrics", headers=auth).status_code == 200
        release.set()
