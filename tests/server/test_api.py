"""The OpenAI-compatible API against a real ``speculant serve`` (n-gram speculation,
a small KV pool), with the official ``openai`` client and raw ``httpx``: answers
equal the offline API's, streamed text equals whole text, bad requests are 4xx
with the offline API's messages and leave the server serving."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_proc import sse_events

from speculant import SamplingParams
from tiny_models import random_prompts

PROMPTS = ["def parse(text):\n    ", "class Queue:\n", "import os\nimport sys\n\n", "for i in range(10):"]
TOKEN_PROMPTS = random_prompts([7, 19], seed=3)


def offline(reference, prompt, **kw):
    return reference.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0].outputs[0]


@pytest.mark.parametrize("max_tokens", [1, 24])
def test_greedy_completions_equal_generate(server, reference, max_tokens):
    client = server.client()
    for prompt in [*PROMPTS, *TOKEN_PROMPTS]:
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0)
        want = offline(reference, prompt, max_tokens=max_tokens, temperature=0)
        c = got.choices[0]
        assert (c.text, c.finish_reason) == (want.text, want.finish_reason), prompt
        assert got.usage.completion_tokens == len(want.token_ids)
        assert got.usage.prompt_tokens == len(reference.tokenizer(prompt)["input_ids"]) \
            if isinstance(prompt, str) else len(prompt)


def test_seeded_sampling_and_stop_strings_equal_generate(server, reference, spec_reference):
    client = server.client()
    for prompt in PROMPTS:
        kw = dict(max_tokens=20, temperature=0.8, top_p=0.9, seed=11)
        got = client.completions.create(model="tiny", prompt=prompt, extra_body={"top_k": 50, "min_p": 0.01}, **kw)
        assert got.choices[0].text == offline(spec_reference, prompt, top_k=50, min_p=0.01, **kw).text
    prompt = PROMPTS[0]
    whole = offline(reference, prompt, max_tokens=24, temperature=0).text
    stop = whole[len(whole) // 2:][:3]  # a stop string greedy decoding reaches
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    want = offline(reference, prompt, max_tokens=24, temperature=0, stop=[stop])
    assert (got.choices[0].text, got.choices[0].finish_reason) == (want.text, "stop")


def test_stream_concatenation_equals_whole_answer(server):
    client = server.client()
    for prompt in PROMPTS:
        whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=40, temperature=0)
        chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=40, temperature=0,
                                                stream=True))
        assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
        assert [c.choices[0].finish_reason for c in chunks][-1] == whole.choices[0].finish_reason
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_stream_events_carry_the_tokens_of_a_step(server):
    """Raw SSE: one event per committed step; with n-gram speculation on a repetitive
    prompt some step accepts proposals, and its event carries several tokens."""
    client = server.client()
    candidates = [*PROMPTS, *TOKEN_PROMPTS, *random_prompts([5, 9, 14, 23], seed=8)]
    prompt = next((p for p in candidates if client.completions.create(
        model="tiny", prompt=p, max_tokens=60, temperature=0).model_extra["speculant"]["accepted_tokens"]), None)
    assert prompt is not None, "no candidate prompt accepts an n-gram proposal"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 60, "temperature": 0, "stream": True, "logprobs": 0,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert events[-2]["choices"] == []
    token_events = events[:-2]
    per_event = [len(e["choices"][0]["logprobs"]["tokens"]) for e in token_events if e["choices"][0]["logprobs"]]
    assert sum(per_event) == usage["completion_tokens"]
    summary = token_events[-1]["speculant"]
    assert summary["accepted_tokens"] > 0 and max(per_event) > 1, (summary, per_event)
    assert summary["draft_tokens"] >= summary["accepted_tokens"]
    assert summary["mean_acceptance_length"] > 1


def test_chat_equals_llm_chat(server, reference):
    client = server.client()
    conversation = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "A queue?"}]
    params = SamplingParams(max_tokens=20, temperature=0)
    want = reference.chat(conversation, params, use_tqdm=False)[0].outputs[0]
    got = client.chat.completions.create(model="tiny", messages=conversation, max_tokens=20, temperature=0)
    assert got.object == "chat.completion" and got.choices[0].message.role == "assistant"
    assert (got.choices[0].message.content, got.choices[0].finish_reason) == (want.text, want.finish_reason)
    chunks = list(client.chat.completions.create(model="tiny", messages=conversation, max_completion_tokens=20,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text


def test_logprobs_are_the_offline_apis(server, reference):
    client = server.client()
    prompt = PROMPTS[1]
    want = offline(reference, prompt, max_tokens=8, temperature=0, logprobs=3)
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([e[t] for t, e in zip(want.token_ids, want.logprobs)], abs=1e-4)
    tok = reference.tokenizer  # completions key alternatives by text: tokens that decode alike share a key
    assert [len(t) for t in lp.top_logprobs] == [len({tok.decode([i]) for i in list(e)[:3]}) for e in want.logprobs]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)  # greedy: the top token


def test_models_health_and_metrics(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    m = server.metrics()
    for name in ("speculant_kv_blocks_in_use", "speculant_requests_waiting", "speculant_step_seconds_count",
                 "speculant_spec_drafts_total", "speculant_spec_draft_tokens_total",
                 "speculant_spec_accepted_tokens_total", "speculant_spec_mean_acceptance_length",
                 "speculant_kv_blocks_cached", "speculant_prefix_cache_hit_tokens_total",
                 "speculant_prefix_cache_queried_tokens_total", "speculant_prefix_cache_hit_blocks_total",
                 "speculant_prefix_cache_evictions_total", "speculant_prefix_cache_hit_rate",
                 "process_resident_memory_bytes"):
        assert name in m, name
    assert m['speculant_spec_accepted_tokens_per_position_total{position="0"}'] >= 0


def _sampling_error(**kw) -> str:
    try:
        SamplingParams(**kw)
    except (TypeError, ValueError) as exc:
        return str(exc)
    raise AssertionError(f"SamplingParams({kw}) was accepted")


BAD = [  # (body or raw text, status, fragment of the message)
    ('{"prompt": "x", ', 400, "not valid JSON"),
    ("[1, 2]", 400, "must be a JSON object"),
    ({"prompt": "x", "max_tokens": -3}, 400, _sampling_error(max_tokens=-3)),
    ({"prompt": "x", "max_tokens": "5"}, 400, _sampling_error(max_tokens="5")),
    ({"prompt": "x", "temperature": "hot"}, 400, _sampling_error(temperature="hot")),
    ({"prompt": "x", "top_p": 1.5}, 400, _sampling_error(top_p=1.5)),
    ({"prompt": "x", "logprobs": 21}, 400, _sampling_error(logprobs=21)),
    ({"prompt": "x", "stop": [""]}, 400, _sampling_error(stop=[""])),
    ({"prompt": "x", "bogus_field": 1}, 400, "unknown field 'bogus_field'"),
    ({"prompt": "x", "stream": "yes"}, 400, "field 'stream'"),
    ({"prompt": "x", "n": 2}, 400, "only n=1 is supported"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "penalties are not implemented"),
    ({"prompt": ["a", "b"]}, 400, "one prompt per request"),
    ({"prompt": [5] * 300}, 400, "prompt has 300 tokens but max_model_len is 256"),
    ({"prompt": [5, 9999]}, 400, "outside the vocabulary"),
    ({"prompt": ""}, 400, "prompt is empty"),
    ({}, 400, "field 'prompt' is required"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model 'gpt-4' does not exist"),
]


@pytest.mark.parametrize("body,status,message", BAD)
def test_bad_request_is_a_clear_4xx_and_the_next_request_succeeds(server, body, status, message):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) \
        else {"json": body}
    r = httpx.post(server.url + "/v1/completions", timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert message in err["message"] and err["type"] in ("invalid_request_error", "not_found_error"), err
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2


def test_bad_chat_requests(server):
    client = server.client()
    cases = [({"messages": []}, "messages"), ({"messages": [{"role": "wizard", "content": "hi"}]}, "role='wizard'"),
             ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "needs logprobs=true"),
             ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 30},
              _sampling_error(logprobs=30))]
    for body, message in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", **body)
        assert message in str(info.value), (body, str(info.value))
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
