"""Faults, a full queue and shutdown, on a server with two test plugins
(``faulty_server.py``): a scorer failing one request is a 500 naming the plugin
while the others succeed; a proposer fault costs only speculation; a full
waiting queue answers 429 with Retry-After and drains; SIGTERM lets the
in-flight stream finish and exits 0."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from faulty_server import PROPOSE_FAIL, SCORE_FAIL, SLOW
from server_proc import ServerProcess, engine_config, sse_events, write_toml

from speculant import SamplingParams

LAUNCHER = Path(__file__).with_name("faulty_server.py")
MAX_QUEUED = 3
LONG = {"max_tokens": 120, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def faulty(chat_model_dir, tmp_path_factory):
    """Two running at most, three waiting at most; a pool that never preempts."""
    d = tmp_path_factory.mktemp("faulty-server")
    data = engine_config(chat_model_dir, proposer="raising_ngram", scorer="faulty_scorer", max_num_seqs=2,
                         num_blocks=160)
    args = ["--config", str(write_toml(data, d / "serve.toml")), "--max-queued", str(MAX_QUEUED),
            "--shutdown-timeout", "60"]
    proc = ServerProcess(args, d, launcher=LAUNCHER).start()
    yield proc
    assert proc.stop() == 0, proc.read_log()


def test_a_scorer_failing_one_request_is_a_500_naming_the_plugin(faulty, reference):
    client = faulty.client()
    prompts = [SCORE_FAIL + " x", "def f(x):", "import re\n"]

    def ask(prompt):
        try:
            return client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=12,
                                             temperature=0)
        except openai.APIStatusError as exc:
            return exc

    with ThreadPoolExecutor(3) as pool:
        bad, *good = pool.map(ask, prompts)
    assert isinstance(bad, openai.InternalServerError), bad
    message = bad.body["message"]
    assert "scorer plugin 'faulty_scorer'" in message and "injected scoring fault" in message, message
    for prompt, out in zip(prompts[1:], good):
        want = reference.generate([prompt], SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)
        assert out.choices[0].text == want[0].outputs[0].text
    assert faulty.metrics()["speculant_failed_requests_total"] == 1


def test_a_streamed_request_that_fails_ends_with_an_error_event(faulty):
    """Headers are sent before the engine runs: the failure arrives as an error event
    (OpenAI's shape, naming the plugin) followed by [DONE]; the openai client raises it."""
    body = {"prompt": SCORE_FAIL + " streamed", "max_tokens": 8, "stream": True, "temperature": 0}
    with httpx.stream("POST", faulty.url + "/v1/completions", json=body, timeout=60) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert "scorer plugin 'faulty_scorer'" in error["message"] and error["code"] == "request_failed", events
    client = faulty.client()
    with pytest.raises(openai.APIError, match="faulty_scorer"):
        list(client.completions.create(model=client.models.list().data[0].id, prompt=SCORE_FAIL, max_tokens=4,
                                       stream=True))


def test_a_proposer_fault_costs_speculation_not_the_request(faulty, reference):
    before = faulty.metrics()["speculant_proposer_errors_total"]
    prompt = PROPOSE_FAIL + " def g():"
    client = faulty.client()
    out = client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=12,
                                    temperature=0)
    want = reference.generate([prompt], SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)
    assert out.choices[0].text == want[0].outputs[0].text and out.choices[0].finish_reason == "length"
    assert faulty.metrics()["speculant_proposer_errors_total"] > before


def _first_event(lines) -> str:
    return next(line for line in lines if line.startswith("data: "))


def test_a_full_queue_answers_429_then_drains(faulty):
    url = faulty.url + "/v1/completions"
    with httpx.Client(timeout=120) as client, contextlib.ExitStack() as stack:
        streams = []
        for i in range(2):  # running (max_num_seqs = 2): wait for their first token
            r = stack.enter_context(client.stream("POST", url, json={"prompt": f"run {i}", "stream": True, **LONG}))
            lines = r.iter_lines()
            _first_event(lines)
            streams.append(lines)
        for i in range(MAX_QUEUED):  # admitted (200 sent), waiting for a slot
            r = stack.enter_context(client.stream("POST", url, json={"prompt": f"wait {i}", "stream": True, **LONG}))
            assert r.status_code == 200
            streams.append(r.iter_lines())
        full = client.post(url, json={"prompt": "one more", "max_tokens": 2})
        assert full.status_code == 429 and full.headers["retry-after"] == "1", full.text
        error = full.json()["error"]
        assert error["type"] == "rate_limit_error" and "--max-queued 3" in error["message"], error
        assert faulty.metrics()["speculant_requests_queued"] == MAX_QUEUED
        for lines in streams:  # every admitted request completes
            data = [line for line in lines if line.startswith("data: ")]
            assert data[-1] == "data: [DONE]" and '"finish_reason": "length"' in data[-2]
    m = faulty.wait_idle()
    assert m["speculant_requests_queued"] == 0 and m["speculant_kv_blocks_in_use"] == 0
    assert m['speculant_requests_total{finish_reason="rejected"}'] == 1
    assert httpx.post(url, json={"prompt": "after", "max_tokens": 2}, timeout=60).status_code == 200


def _wait_for(server, condition, limit_s: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + limit_s
    while True:
        m = server.metrics()
        if condition(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_a_client_gone_before_its_whole_answer_is_aborted(faulty):
    """A non-streaming request waiting behind two slow running streams; its client
    hangs up: the server notices, aborts it and it leaves the queue."""
    url = faulty.url + "/v1/completions"
    abort = 'speculant_requests_total{finish_reason="abort"}'
    aborted0 = faulty.metrics().get(abort, 0)
    with httpx.Client(timeout=120) as client, contextlib.ExitStack() as stack:
        held = []  # an event iterator dropped would close its stream
        for i in range(2):
            hold = {"prompt": f"{SLOW} hold {i}", "stream": True, **LONG, "max_tokens": 240}
            held.append(stack.enter_context(client.stream("POST", url, json=hold)).iter_lines())
            _first_event(held[-1])
        body = json.dumps({"prompt": "never read", **LONG}).encode()
        sock = socket.create_connection(("127.0.0.1", faulty.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert _wait_for(faulty, lambda m: m["speculant_requests_queued"] == 1)["speculant_requests_queued"] == 1
        sock.close()
        m = _wait_for(faulty, lambda m: m.get(abort, 0) == aborted0 + 1)
        assert m.get(abort, 0) == aborted0 + 1 and m["speculant_requests_queued"] == 0, m
    assert faulty.wait_idle()["speculant_kv_blocks_in_use"] == 0


def test_sigterm_finishes_the_stream_in_flight_and_exits_0(faulty):
    body = {"prompt": "last words", "stream": True, **LONG}
    with httpx.stream("POST", faulty.url + "/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        _first_event(lines)
        faulty.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and '"finish_reason": "length"' in rest[-2]
    assert faulty.proc.wait(60) == 0, faulty.read_log()
    with pytest.raises(httpx.TransportError):
        httpx.get(faulty.url + "/health", timeout=5)
