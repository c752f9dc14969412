"""`speculant serve --ray`: two Ray Serve replicas behind Serve's proxy, over loopback with the openai client.

One deployment for the module (2 replicas at 0.5 CPU each, n-gram speculation,
an API key, a 64 KiB body limit); the replica kill runs last.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time

import httpx
import openai
import pytest

from batch_helpers import PROMPTS, chat_model
from speculant import LLM, SamplingParams

pytest.importorskip("ray", reason="Ray is not installed: pip install 'speculant[ray]'")

from speculant.config.compat import build_config
from speculant.server.ray_serve import KILL_ENV, ReplicaOptions, deploy, undeploy

KEY = "test-key"
LIMIT = 65536
AUTH = {"Authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def kill_flag(tmp_path_factory):
    return tmp_path_factory.mktemp("serve-kill") / "kill"


@pytest.fixture(scope="module")
def ray_env(kill_flag):  # the replicas see it: one exits once the file exists
    return {KILL_ENV: str(kill_flag)}


@pytest.fixture(scope="module")
def model(llama_dir, tmp_path_factory):
    return chat_model(llama_dir, tmp_path_factory.mktemp("serve-model"))


def config_data(model) -> dict:
    return {"model": {"path": str(model), "dtype": "float32"},
            "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 128},
            "speculative": {"proposer": "ngram", "num_speculative_tokens": 3}}


@pytest.fixture(scope="module")
def url(ray_cluster, model):
    options = ReplicaOptions("tiny", api_keys=(KEY,), max_request_bytes=LIMIT)
    url = deploy(build_config(config_data(model), "test"), "test", options, replicas=2, cpus_per_replica=0.5,
                 port=free_port())
    yield url
    undeploy(options)


@pytest.fixture(scope="module")
def reference(model):
    data = config_data(model)
    data["speculative"] = {}
    return LLM.from_dict(data, "reference")


def metric_sums(url: str) -> dict[str, float]:
    """Series name with its labels but ``replica`` -> the sum over replicas; plus ``replicas:<name>``: how
    many replicas report it."""
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=30).text
    sums: dict[str, float] = {}
    replicas: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, value = line.rsplit(" ", 1)
        replica = re.search(r'replica="([^"]*)"', series)
        assert replica, f"a series without its replica label: {line}"
        key = re.sub(r',?replica="[^"]*"', "", series).replace("{}", "").replace("{,", "{")
        sums[key] = sums.get(key, 0.0) + float(value)
        if float(value):
            replicas.setdefault(key, set()).add(replica.group(1))
    return {**sums, **{f"replicas:{k}": len(v) for k, v in replicas.items()}}


def wait_for(url: str, check, timeout: float = 15.0) -> dict[str, float]:
    """Poll /metrics until ``check(sums)`` holds (replicas report every second)."""
    deadline = time.monotonic() + timeout
    while True:
        sums = metric_sums(url)
        if check(sums) or time.monotonic() > deadline:
            return sums
        time.sleep(0.3)


async def stream_one(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> tuple[set[str], str, dict]:
    ids, text, spec = set(), "", {}
    stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True})
    async for chunk in stream:
        ids.add(chunk.id)
        text += chunk.choices[0].text
        spec = (chunk.model_extra or {}).get("speculant", spec)
    return ids, text, spec


async def whole_one(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> tuple[set[str], str, dict]:
    out = await client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                          extra_body={"ignore_eos": True})
    return {out.id}, out.choices[0].text, (out.model_extra or {}).get("speculant", {})


def prompts(n: int) -> list[str]:
    return [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(n)]


def test_64_concurrent_streams_equal_llm_generate_and_metrics_sum(url, reference):
    before = metric_sums(url)
    ps = prompts(64)
    max_tokens = [4 + i % 9 for i in range(64)]

    async def run():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300) as client:
            return await asyncio.gather(*(stream_one(client, p, m) for p, m in zip(ps, max_tokens)))

    results = asyncio.run(run())
    want = reference.generate(ps, [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in max_tokens],
                              use_tqdm=False)
    assert [text for _, text, _ in results] == [o.outputs[0].text for o in want]
    ids = [i for ids, _, _ in results for i in ids]
    assert all(len(i) == 1 for i, _, _ in results) and len(set(ids)) == 64  # one id per stream, none shared
    accepted = sum(spec["accepted_tokens"] for _, _, spec in results)
    drafted = sum(spec["draft_tokens"] for _, _, spec in results)
    assert accepted > 0

    key = 'speculant_requests_total{finish_reason="length"}'
    sums = wait_for(url, lambda s: s.get(key, 0) - before.get(key, 0) == 64)
    assert sums[key] - before.get(key, 0) == 64
    assert sums[f"replicas:{key}"] == 2, "both replicas served and both report"
    assert sums["speculant_spec_accepted_tokens_total"] - before.get("speculant_spec_accepted_tokens_total", 0) \
        == accepted
    assert sums["speculant_spec_draft_tokens_total"] - before.get("speculant_spec_draft_tokens_total", 0) == drafted
    per_position = [v for k, v in sums.items() if k.startswith("speculant_spec_accepted_tokens_per_position_total{")]
    assert len(per_position) == 3 and sum(per_position) == sums["speculant_spec_accepted_tokens_total"]


def test_client_disconnect_aborts_the_request_on_its_replica(url):
    key = 'speculant_requests_total{finish_reason="abort"}'
    before = metric_sums(url).get(key, 0)
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    # as long as max_model_len (256) allows, sampled (drafts accepted less often: more steps)
    stream = client.completions.create(model="tiny", prompt="x", max_tokens=250, temperature=1.0, seed=0,
                                       stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    sums = wait_for(url, lambda s: s.get(key, 0) == before + 1 and s["speculant_requests_running"] == 0)
    assert sums.get(key, 0) == before + 1
    assert sums["speculant_requests_running"] == 0 and sums["speculant_kv_blocks_in_use"] == 0


def test_api_key_and_body_limit_hold_behind_the_proxy(url):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
    r = httpx.post(url + "/v1/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(url + "/v1/completions", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(url + "/metrics").status_code == 401
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.post(url + "/v1/completions", json=body, headers=AUTH).status_code == 200
    r = httpx.post(url + "/v1/completions", content=b"x" * (LIMIT + 1), headers=AUTH)
    assert r.status_code == 413 and r.json()["error"]["message"].startswith(
        f"the request body is {LIMIT + 1} bytes (its Content-Length), over this server's limit of {LIMIT} bytes")
    r = httpx.post(url + "/v1/completions", content=iter([b"x" * 16384] * 8), headers=AUTH)  # chunked, no length
    assert r.status_code == 413 and f"over {LIMIT} bytes" in r.json()["error"]["message"]
    # The proxy does not hold a body back until it has all of it: a request declaring 10 GiB and
    # sending 1 KiB is answered 413 at once (a buffering proxy would wait for the rest).
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {10 * 2**30}\r\n\r\n".encode() + b"x" * 1024)
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def test_a_killed_replica_costs_only_its_in_flight_requests(url, reference, kill_flag):
    ps = prompts(24)
    claimed = kill_flag.parent / (kill_flag.name + ".claimed")

    async def run():
        # armed first: the replica that dies does so once the burst below has landed (none of its
        # requests still on the way), and writes how many it held
        kill_flag.touch()
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300) as client:
            tasks = [asyncio.create_task(stream_one(client, p, 200) if i % 2 == 0 else whole_one(client, p, 200))
                     for i, p in enumerate(ps)]
            return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(run())
    assert claimed.exists(), "no replica died: the test proved nothing"
    in_flight = int(claimed.read_text())
    want = reference.generate(ps, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True), use_tqdm=False)
    failed = [r for r in results if isinstance(r, BaseException)]
    for r, w in zip(results, want):
        if not isinstance(r, BaseException):
            assert r[1] == w.outputs[0].text
    assert 1 <= len(failed) <= in_flight, (len(failed), in_flight)
    # What Serve's proxy does with the requests of a replica that died: a whole answer is its own plain-text
    # 500, a stream is cut off before [DONE] (the openai client raises a connection error); the replica
    # cannot answer in OpenAI's error shape, being dead.
    for i, r in enumerate(results):
        if isinstance(r, BaseException) and i % 2:
            assert isinstance(r, openai.InternalServerError) and r.status_code == 500, repr(r)
            assert r.body == "Internal Server Error"
        elif isinstance(r, BaseException):
            assert isinstance(r, openai.APIConnectionError), repr(r)
    # the survivor (and the replacement Serve starts) go on serving
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    out = client.completions.create(model="tiny", prompt=ps[0], max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == reference.generate(
        [ps[0]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True), use_tqdm=False)[0].outputs[0].text


def test_serve_ray_usage_errors_exit_2(tmp_path, capsys):
    from speculant.cli import main
    from speculant.server.ray_serve import parse_autoscale

    assert main(["serve", "--model", str(tmp_path), "--replicas", "2"]) == 2
    assert "--replicas, --autoscale and --cpus-per-replica only apply with --ray" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path), "--ray", "--threads", "2"]) == 2
    assert "--threads does not apply with --ray" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path), "--ray", "--replicas", "0"]) == 2
    assert "--replicas 0: need at least 1 replica" in capsys.readouterr().err
    assert parse_autoscale("1:4") == (1, 4) and parse_autoscale("0:2") == (0, 2)
    for bad in ("4", "3:1", "a:b", "0:0", "-1:2"):
        with pytest.raises(ValueError, match=f"--autoscale {bad}: expected MIN:MAX replicas"):
            parse_autoscale(bad)


def test_autoscale_hands_serve_min_max_and_the_engine_batch_as_target(ray_cluster, model, monkeypatch):
    """`--autoscale MIN:MAX` becomes Serve's autoscaling config (no fixed replica count), the
    target of ongoing requests per replica being what one engine batches. Serve's scaling itself
    is Ray's (run by hand here: 1:2 served correctly)."""
    import ray
    from ray import serve

    from speculant.server import ray_serve

    seen: dict = {}

    class Recorder:
        def options(self, **kwargs):
            seen.update(kwargs)
            return self

        def bind(self, *args):
            return "app"

    monkeypatch.setattr(serve, "deployment", lambda cls: Recorder())
    monkeypatch.setattr(serve, "start", lambda **kwargs: None)
    monkeypatch.setattr(serve, "run", lambda app, **kwargs: seen.update(ran=app, **kwargs))
    options = ReplicaOptions("tiny", hub_name="autoscale-test-hub")
    try:
        deploy(build_config(config_data(model), "test"), "test", options, autoscale=(0, 3), cpus_per_replica=0.5)
    finally:
        ray.kill(ray.get_actor(options.hub_name, namespace=ray_serve.HUB_NAMESPACE))
    assert seen["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 3, "initial_replicas": 1,
                                          "target_ongoing_requests": 16}
    assert "num_replicas" not in seen and seen["ray_actor_options"] == {"num_cpus": 0.5}
    assert seen["ran"] == "app"
