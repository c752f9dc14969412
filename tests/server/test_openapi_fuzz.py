"""Schemathesis against a real ``speculant serve`` (loopback only, an API key):
every operation in ``/openapi.json``, positive and negative bodies, all
checks. The run must end with no failure: every status, content type and
body the server answers is the one its schema documents, bodies the schema
refuses are refused, and bodies it allows run (``schemathesis_hooks.py``
says which 400s a schema-valid body may still get). Requests without the key
must be 401 (``ignored_auth``, from the schema's bearer security scheme).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from server_proc import ServerProcess, engine_config, write_toml

pytest.importorskip("schemathesis")

API_KEY = "fuzz-key"
MAX_EXAMPLES = 60
"""Per operation in the fuzzing phase (the issue's own run); the whole run takes about 30 s on two busy cores."""
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def keyed_server(chat_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    config = write_toml(engine_config(chat_model_dir), d / "serve.toml")
    proc = ServerProcess(["--config", str(config), "--served-model-name", "tiny", "--api-key", API_KEY], d,
                         api_key=API_KEY).start()
    yield proc
    assert proc.stop() == 0, proc.read_log()


def test_schemathesis_finds_no_failure(keyed_server, tmp_path):
    assert keyed_server.url.startswith("http://127.0.0.1:")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", keyed_server.url + "/openapi.json",
           "--checks", "all", "--exclude-checks", "positive_data_acceptance",
           "--max-examples", os.environ.get("SPECULANT_FUZZ_EXAMPLES", str(MAX_EXAMPLES)),
           "-H", f"Authorization: Bearer {API_KEY}", "--request-timeout", "60", "--workers", "1",
           "--seed", "54", "--suppress-health-check", "all", "--no-color"]
    run = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    if os.environ.get("SPECULANT_FUZZ_LOG"):
        Path(os.environ["SPECULANT_FUZZ_LOG"]).write_text(out)
    assert run.returncode == 0, out[-20000:]
    cases = re.search(r"Test cases:\s*(\d+) generated, (\d+) passed", out)
    assert cases is not None, out[-5000:]
    generated, passed = int(cases.group(1)), int(cases.group(2))
    assert generated == passed > 500, out[-5000:]  # every case run and passed (1008 at seed 54)
    print(out[-3000:])


def test_without_the_key_every_route_but_health_is_401(keyed_server):
    for path in ("/openapi.json", "/v1/models", "/metrics", "/docs"):
        r = httpx.get(keyed_server.url + path, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    r = httpx.post(keyed_server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=30)
    assert r.status_code == 401, r.text
    assert httpx.get(keyed_server.url + "/health", timeout=30).status_code == 200
