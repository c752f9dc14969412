"""The app while its model loads (in process, through Starlette's TestClient):
503 with Retry-After on every route but /metrics until the engine is ready,
then 200; a model that fails to load is reported to the command."""

from __future__ import annotations

import threading
import time

from fastapi.testclient import TestClient
from server_proc import engine_config

from speculant.config.compat import build_config
from speculant.engine.llm_engine import LLMEngine
from speculant.server.app import ServerState, build_app


def test_health_is_503_while_loading_then_200(chat_model_dir):
    release = threading.Event()
    config = build_config(engine_config(chat_model_dir), "test")

    def load() -> LLMEngine:
        release.wait(60)
        return LLMEngine(config)

    state = ServerState(load, "tiny", max_queued=4)
    with TestClient(build_app(state)) as client:
        for method, path in (("get", "/health"), ("get", "/v1/models"), ("post", "/v1/completions")):
            r = getattr(client, method)(path, **({"json": {"prompt": "x"}} if method == "post" else {}))
            assert r.status_code == 503 and r.headers["retry-after"] == "5", (path, r.text)
            assert r.json()["error"]["code"] == "model_loading" and "still loading" in r.json()["error"]["message"]
        assert client.get("/metrics").status_code == 200  # scrapable while loading
        release.set()
        for _ in range(600):
            if state.loop is not None:
                break
            time.sleep(0.1)
        assert client.get("/health").json() == {"status": "ok"}
        r = client.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_a_model_that_fails_to_load_is_reported(tmp_path):
    errors: list[str] = []
    loaded = threading.Event()

    def load() -> LLMEngine:
        try:
            raise OSError(f"no model files in {tmp_path}")
        finally:
            loaded.set()

    state = ServerState(load, "none", max_queued=4, on_load_error=errors.append)
    with TestClient(build_app(state)) as client:
        loaded.wait(10)
        for _ in range(100):
            if errors:
                break
            time.sleep(0.05)
        assert client.get("/health").status_code == 503
    assert errors == [f"OSError: no model files in {tmp_path}"]
