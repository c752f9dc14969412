"""A server fit to expose, measured on real servers on loopback: requests without a
valid key are 401 and never reach the engine; a 50 MB body is 413 before the
client has sent it, declared or chunked, and the server's memory does not grow; a
20 MB prompt (under the body limit, far over max_model_len) is a 400 about as fast
as its JSON parses, refused by its length before tokenizing, while small requests
keep their latency. No absolute time bound: bytes sent, and ratios of times taken
side by side (a shared machine slows both)."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterable

import httpx
import openai
import pytest
from server_proc import ServerProcess, engine_config, write_toml

KEYS = ("key-one", "key-two")
MiB = 2**20
EXPOSED_LIMIT = 24 * MiB  # a 20 MiB prompt fits, a 50 MiB body does not
SUBMISSIONS = "speculant_engine_submissions_total"


@pytest.fixture(scope="module")
def exposed(chat_model_dir, tmp_path_factory):
    """Two keys from SPECULANT_API_KEY, a 24 MiB body limit."""
    d = tmp_path_factory.mktemp("exposed-server")
    config = write_toml(engine_config(chat_model_dir), d / "serve.toml")
    proc = ServerProcess(["--config", str(config), "--served-model-name", "tiny", "--max-request-bytes",
                          str(EXPOSED_LIMIT)], d, api_key=KEYS[0], env={"SPECULANT_API_KEY": ",".join(KEYS)})
    yield proc.start()
    assert proc.stop() == 0, proc.read_log()


async def _unauthorized(url: str, n: int) -> list[httpx.Response]:
    body = {"model": "tiny", "prompt": "def f(", "max_tokens": 4}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    cases = itertools.cycle([
        ("POST", "/v1/completions", {}, body),
        ("POST", "/v1/chat/completions", {"Authorization": "Bearer wrong"}, chat),
        ("POST", "/v1/completions", {"Authorization": f"Bearer {KEYS[0]}x"}, body),
        ("POST", "/v1/completions", {"Authorization": f"Bearer {KEYS[1][:-1]}"}, body),
        ("POST", "/v1/completions", {"Authorization": KEYS[0]}, body),
        ("GET", "/v1/models", {"Authorization": "Basic a2V5LW9uZTo="}, None),
        ("GET", "/metrics", {}, None),
        ("GET", "/v1/no-such-route", {"Authorization": "Bearer"}, None),
    ])
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        gate = asyncio.Semaphore(32)

        async def one(method, path, headers, json_body):
            async with gate:
                return await client.request(method, path, headers=headers, json=json_body)

        return await asyncio.gather(*(one(*case) for case in itertools.islice(cases, n)))


def test_a_thousand_requests_without_a_valid_key_are_401_and_none_reaches_the_engine(exposed):
    before = exposed.metrics()
    responses = asyncio.run(_unauthorized(exposed.url, 1000))
    assert {r.status_code for r in responses} == {401}
    for r in responses[:8]:
        error = r.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error", error
        assert r.headers["www-authenticate"] == "Bearer" and "--api-key" in error["message"]
    after = exposed.metrics()
    assert after[SUBMISSIONS] == before[SUBMISSIONS]
    assert after["speculant_prompt_tokens_total"] == before["speculant_prompt_tokens_total"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=exposed.url + "/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(exposed.url + "/health").status_code == 200  # open, for probes
    for key in KEYS:  # either key of SPECULANT_API_KEY works
        client = openai.OpenAI(base_url=exposed.url + "/v1", api_key=key, max_retries=0, timeout=60)
        assert client.completions.create(model="tiny", prompt="def f(", max_tokens=2).usage.completion_tokens <= 2
    assert exposed.metrics()[SUBMISSIONS] == before[SUBMISSIONS] + 2


def _raw_post(port: int, headers: list[str], body: Iterable[bytes]) -> tuple[int, dict, float, int]:
    """POST with the body written by a second thread, as a client that sends its whole
    body before reading would; returns the status, the JSON answer, the seconds from
    the headers sent to the answer read, and the body bytes sent by then (at most what
    the server read plus what the sockets' buffers hold)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = "\r\n".join(["POST /v1/completions HTTP/1.1", "Host: x", "Content-Type: application/json", *headers])
    start = time.perf_counter()
    sock.sendall(head.encode() + b"\r\n\r\n")
    sent = [0]

    def write() -> None:
        try:
            for chunk in body:
                sock.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass  # the server may close once it has answered

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
        part = sock.recv(65536)
        assert part, f"connection closed after {data!r}"
        data += part
    seconds, sent_by_then = time.perf_counter() - start, sent[0]
    writer.join(60)
    sock.close()
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2]), seconds, sent_by_then


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 62


def _megabytes(n: int, chunked: bool) -> Iterable[bytes]:
    block = b"x" * MiB
    for _ in range(n):
        yield b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
    if chunked:
        yield b"0\r\n\r\n"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_50mb_body_is_413_before_it_is_sent_and_memory_does_not_grow(server, chunked):
    """On the main server (the default limit, 4 MiB): declared, it is refused from its
    headers; chunked, at the limit. Either way the process holds at most the limit."""
    rss_before = server.rss_bytes()
    headers = ["Transfer-Encoding: chunked"] if chunked else [f"Content-Length: {50 * MiB}"]
    status, answer, seconds, sent = _raw_post(server.port, headers, _megabytes(50, chunked))
    rss_growth = server.rss_bytes() - rss_before
    print(f"413 ({'chunked' if chunked else 'content-length'}) in {seconds * 1000:.0f} ms, "
          f"{sent / MiB:.0f} MiB sent by then, RSS {rss_growth / MiB:+.1f} MiB")
    assert status == 413 and answer["error"]["code"] == "request_too_large", answer
    assert "--max-request-bytes 4194304" in answer["error"]["message"]
    assert sent < 50 * MiB, "answered only after the whole body was sent"  # bytes, not seconds
    assert rss_growth < 20 * MiB, f"RSS grew {rss_growth / MiB:.1f} MiB"
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


class _Ticker(threading.Thread):
    """Small completions back to back; records (start, end) of each."""

    def __init__(self, server: ServerProcess) -> None:
        super().__init__(daemon=True)
        self.server, self.spans, self.stop = server, [], threading.Event()

    def one(self, client: httpx.Client) -> tuple[float, float]:
        start = time.perf_counter()
        r = client.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        return start, time.perf_counter()

    def run(self) -> None:
        with httpx.Client(base_url=self.server.url, headers=self.server.headers, timeout=60) as client:
            while not self.stop.is_set():
                self.spans.append(self.one(client))


def test_a_20mb_prompt_is_a_400_as_fast_as_it_parses_and_small_requests_keep_their_latency(exposed):
    probe = _Ticker(exposed)
    with httpx.Client(base_url=exposed.url, headers=exposed.headers, timeout=60) as client:
        baseline = [end - start for start, end in (probe.one(client) for _ in range(12))][2:]
    text = "x" * (20 * MiB)
    bodies = {"/v1/completions": {"model": "tiny", "prompt": text, "max_tokens": 4},
              "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": text}]}}
    contents = {path: json.dumps(body).encode() for path, body in bodies.items()}  # before any timing
    # the cost of reading and parsing such a body: the same bytes less the closing brace, a 400 (bad JSON)
    # once the parser reaches the end
    parsing = {}
    with httpx.Client(base_url=exposed.url, headers=exposed.headers, timeout=60) as client:
        for path, content in contents.items():
            start = time.perf_counter()
            r = client.post(path, content=content[:-1], headers={"Content-Type": "application/json"})
            parsing[path] = time.perf_counter() - start
            assert r.status_code == 400 and "JSON" in r.text, r.text
    tickers = [_Ticker(exposed) for _ in range(2)]
    for t in tickers:
        t.start()
    time.sleep(0.3)
    results = {}
    with httpx.Client(base_url=exposed.url, headers=exposed.headers, timeout=60) as client:
        for path, content in contents.items():
            start = time.perf_counter()
            r = client.post(path, content=content, headers={"Content-Type": "application/json"})
            results[path] = (r, start, time.perf_counter())
    time.sleep(0.2)
    for t in tickers:
        t.stop.set()
        t.join(60)
    spans = [s for t in tickers for s in t.spans]
    small = statistics.median(baseline)
    for path, (r, big_start, big_end) in results.items():
        during = [end - start for start, end in spans if start < big_end and end > big_start]
        print(f"{path}: 400 in {(big_end - big_start) * 1000:.0f} ms (bad JSON of that size: "
              f"{parsing[path] * 1000:.0f} ms); small requests meanwhile: {len(during)}, "
              f"max {max(during, default=0) * 1000:.0f} ms (alone: median {small * 1000:.0f}"
              f" ms, max {max(baseline) * 1000:.0f} ms)")
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        chat = path == "/v1/chat/completions"
        head = "the prompt the messages render to has " if chat else f"prompt has {len(text)} characters"
        assert error["message"].startswith(head) and "max_model_len is 256" in error["message"], error
        assert error["param"] == ("messages" if chat else "prompt")
        # ratios of times taken together (no absolute bound): refused about as fast as the body parses
        # (tokenizing 20 MB would take seconds), and a small request waits at most about that long
        assert big_end - big_start < 5 * parsing[path] + 5 * small, (big_end - big_start, parsing[path], small)
        assert during, "no small request overlapped the large one"
        assert max(during) < 5 * parsing[path] + 10 * small, (during, parsing[path], baseline)
