"""Structured output over the API (``response_format``, the ``structured_outputs``
extension) against the real server (n-gram speculation): answers validate,
equal the offline API's under the same grammar, stream the same text, and a
schema that does not compile is a 400 naming the problem."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from json_prefix import check_json_prefix
from speculant import SamplingParams

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                           "kind": {"enum": ["rail", "air"]}},
          "required": ["city", "days", "kind"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}
CONVERSATION = [{"role": "user", "content": "Plan a trip as JSON."}]


def test_chat_response_format_json_schema(server, reference):
    client = server.client()
    got = client.chat.completions.create(model="tiny", messages=CONVERSATION, max_tokens=60, temperature=0,
                                         response_format=FORMAT)
    text = got.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
    assert got.choices[0].finish_reason == "stop"
    want = reference.chat(CONVERSATION, SamplingParams(max_tokens=60, temperature=0,
                                                       structured={"json_schema": SCHEMA}), use_tqdm=False)
    assert text == want[0].outputs[0].text
    chunks = list(client.chat.completions.create(model="tiny", messages=CONVERSATION, max_tokens=60, temperature=0,
                                                 response_format=FORMAT, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_completions_json_object_and_regex(server, reference):
    client = server.client()
    for prompt in ("def parse(text):\n    ", "class Queue:\n"):
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=48, temperature=0, seed=1,
                                        extra_body={"response_format": {"type": "json_object"}})
        want = reference.generate([prompt], SamplingParams(max_tokens=48, temperature=0,
                                                           structured={"json_object": True}), use_tqdm=False)
        choice = got.choices[0]
        assert choice.text == want[0].outputs[0].text and choice.text.startswith("{")
        assert choice.finish_reason == want[0].outputs[0].finish_reason
        if choice.finish_reason == "stop":  # a closed object, else the start of one (max_tokens cut it)
            jsonschema.validate(json.loads(choice.text), {"type": "object"})
        else:
            assert choice.finish_reason == "length" and got.usage.completion_tokens == 48, got
            check_json_prefix(choice.text, {"type": "object"})
    got = client.completions.create(model="tiny", prompt="id: ", max_tokens=20, temperature=0.9, seed=4,
                                    extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{2,4}"}})
    assert got.choices[0].finish_reason == "stop"
    text = got.choices[0].text
    assert len(text) in range(6, 9) and text[:3].isupper() and text[3] == "-" and text[4:].isdigit(), text


@pytest.mark.parametrize("path, body, message", [
    ("/v1/chat/completions", {"messages": CONVERSATION, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "structured output json_schema cannot be compiled: Invalid type: foo; fix the JSON schema"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "(ab"}},
     "structured output regex cannot be compiled: "),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "xml"}},
     "response_format {'type': 'xml'} is not supported"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema needs a string name and a schema"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema",
                                                            "json_schema": {"name": "a", "schema": "{oops"}}},
     "SamplingParams.structured['json_schema'] is not valid JSON"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"},
                         "structured_outputs": {"regex": "a"}},
     "response_format and structured_outputs both constrain the output; send one"),
])
def test_bad_structured_requests_are_400_naming_the_problem(server, path, body, message):
    r = httpx.post(server.url + path, json={"max_tokens": 4, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"], err
    assert err["param"] in ("response_format", "structured_outputs"), err
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200
