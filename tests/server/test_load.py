"""Load on the main server (n-gram speculation, a 256-slot KV pool, 16 running):
concurrent streams of mixed lengths that preempt each other all complete, once,
greedy ones as they would alone; clients that vanish mid-stream free their KV
blocks, and memory levels off across rounds. The slow variant runs 128 streams
on a server speculating with a draft model."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from server_proc import ServerProcess, engine_config, write_toml

from speculant import SamplingParams
from tiny_models import random_prompts


async def _stream(client: httpx.AsyncClient, url: str, body: dict, keep: int | None = None) -> list:
    """The ``data:`` payloads of one streamed request; with ``keep``, hang up
    after that many events."""
    events: list = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
                if keep is not None and len(events) >= keep:
                    break  # leaving the block closes the connection mid-stream
    return events


async def _gather(url: str, bodies: list[dict], keeps: list[int | None]) -> list[list]:
    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return await asyncio.gather(*[_stream(client, url, b, k) for b, k in zip(bodies, keeps)])


def _bodies(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    prompts = random_prompts([rng.randint(3, 60) for _ in range(n)], seed=seed)
    out = []
    for i, p in enumerate(prompts):
        body = {"prompt": p, "max_tokens": rng.randint(4, 80), "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}, "temperature": 0}
        if i % 2:
            body.update(temperature=0.9, seed=i)
        out.append(body)
    return out


def test_concurrent_streams_complete_once_and_greedy_ones_equal_solo_runs(server, reference):
    bodies = _bodies(64, seed=5)
    results = asyncio.run(_gather(server.url, bodies, [None] * len(bodies)))
    ids, preemptions = set(), 0
    for body, events in zip(bodies, results):
        assert events[-1] == "[DONE]" and events[-2]["choices"] == [], events[-2:]
        chunks = events[:-2]
        finals = [e for e in chunks if e["choices"][0]["finish_reason"] is not None]
        assert len(finals) == 1 and finals[0] is chunks[-1], "exactly one finishing event, the last"
        assert finals[0]["choices"][0]["finish_reason"] == "length"
        assert events[-2]["usage"]["completion_tokens"] == body["max_tokens"]
        assert len({e["id"] for e in events[:-1]}) == 1
        ids.add(events[0]["id"])
        preemptions += finals[0]["speculant"]["preemptions"]
        if body["temperature"] == 0:
            text = "".join(e["choices"][0]["text"] for e in chunks)
            params = SamplingParams(max_tokens=body["max_tokens"], temperature=0, ignore_eos=True)
            alone = reference.generate([body["prompt"]], params, use_tqdm=False)[0].outputs[0].text
            assert text == alone
    assert len(ids) == len(bodies), "a request answered twice or under another's id"
    assert preemptions > 0, "the KV pool was meant to force preemption"
    m = server.wait_idle()
    assert m["speculant_kv_blocks_in_use"] == 0 and m["speculant_requests_queued"] == 0


def test_clients_vanishing_mid_stream_free_their_blocks(server):
    """50 streams hung up after 1-5 events, in 5 rounds: after each round the KV
    blocks in use return to 0 and every one counts as aborted; RSS levels off."""
    rng = random.Random(2)
    rss, aborted0 = [], server.metrics().get('speculant_requests_total{finish_reason="abort"}', 0)
    for round_ in range(5):
        bodies = [{"prompt": p, "max_tokens": 200, "ignore_eos": True, "stream": True, "temperature": 0}
                  for p in random_prompts([rng.randint(3, 40) for _ in range(10)], seed=100 + round_)]
        asyncio.run(_gather(server.url, bodies, [rng.randint(1, 5) for _ in bodies]))
        m = server.wait_idle()
        assert m["speculant_kv_blocks_in_use"] == 0, m
        assert m["speculant_requests_queued"] == 0
        rss.append(m["process_resident_memory_bytes"])
    aborted = server.metrics()['speculant_requests_total{finish_reason="abort"}'] - aborted0
    assert aborted == 50
    assert rss[-1] - rss[1] < 48 * 2**20, [f"{r / 2**20:.0f} MiB" for r in rss]


@pytest.mark.slow
def test_draft_model_speculation_under_load(chat_model_dir, spec_noisy_draft_dir, reference, tmp_path):
    """The load test on a second server speculating with a draft model (the target
    plus noise: partial agreement) and 128 streams: all complete, greedy ones
    equal solo runs without speculation, the pool preempts and returns to idle."""
    data = engine_config(chat_model_dir, proposer="draft_model", draft_dir=spec_noisy_draft_dir)
    server = ServerProcess(["--config", str(write_toml(data, tmp_path / "draft.toml"))], tmp_path).start()
    try:
        bodies = _bodies(128, seed=9)
        results = asyncio.run(_gather(server.url, bodies, [None] * len(bodies)))
        preemptions, accepted = 0, 0
        for body, events in zip(bodies, results):
            assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == body["max_tokens"]
            summary = events[-3]["speculant"]
            preemptions, accepted = preemptions + summary["preemptions"], accepted + summary["accepted_tokens"]
            if body["temperature"] == 0:
                params = SamplingParams(max_tokens=body["max_tokens"], temperature=0, ignore_eos=True)
                alone = reference.generate([body["prompt"]], params, use_tqdm=False)[0].outputs[0].text
                assert "".join(e["choices"][0]["text"] for e in events[:-2]) == alone
        assert preemptions > 0 and accepted > 0
        assert server.wait_idle()["speculant_kv_blocks_in_use"] == 0
    finally:
        assert server.stop() == 0, server.read_log()



def test_open_requests_count_a_request_from_arrival_to_its_last_byte(server):
    """``speculant_requests_open``: three requests whose bodies are still arriving (not yet parsed,
    so not yet in the engine) count 3 at every scrape, the scrapes not counting themselves; once
    their bodies end they are answered and the count is back to 0."""

    async def run() -> tuple[list[float], list[int], float]:
        release = asyncio.Event()

        async def slow_body():
            yield b'{"prompt": "a b c", '
            await release.wait()
            yield b'"max_tokens": 3, "temperature": 0, "ignore_eos": true}'

        async with httpx.AsyncClient(timeout=60) as client:
            posts = [asyncio.create_task(client.post(server.url + "/v1/completions", content=slow_body(),
                                                     headers={"Content-Type": "application/json"}))
                     for _ in range(3)]
            seen: list[float] = []
            for _ in range(200):  # until all three have reached the server
                seen.append((await asyncio.to_thread(server.metrics))["speculant_requests_open"])
                if seen[-1] == 3:
                    break
                await asyncio.sleep(0.05)
            seen.append((await asyncio.to_thread(server.metrics))["speculant_requests_open"])
            release.set()
            codes = [(await p).status_code for p in posts]
        return seen, codes, (await asyncio.to_thread(server.metrics))["speculant_requests_open"]

    seen, codes, after = asyncio.run(run())
    assert seen[-2:] == [3, 3] and max(seen) == 3, seen
    assert codes == [200, 200, 200] and after == 0
