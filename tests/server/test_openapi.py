"""The published schema without a server: the request fields ``/docs`` shows,
the statuses and media types documented, replies that match their models,
and refused fields worded by the check that owns them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from speculant.engine.request import CompletionOutput, RequestOutput
from speculant.server import reply_models
from speculant.server.app import ServerState, build_app
from speculant.server.explain import explain
from speculant.server.protocol import MAX_JSON_SEED, ChatCompletionRequest, CompletionRequest
from speculant.server.responses import Reply


def _openapi(api_keys: tuple[str, ...] = ()) -> dict:
    state = ServerState(load=lambda: None, model_name="tiny", max_queued=4, api_keys=api_keys)  # type: ignore
    return build_app(state).openapi()


def test_request_bodies_publish_their_fields_with_types_and_ranges():
    schemas = _openapi()["components"]["schemas"]
    completion = schemas["CompletionRequest"]
    assert completion["required"] == ["prompt"] and completion["additionalProperties"] is False
    props = completion["properties"]
    for name in ("prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "logprobs",
                 "stop_token_ids", "ignore_eos", "response_format", "structured_outputs", "stream_options"):
        assert name in props, name
    assert props["n"]["minimum"] == props["n"]["maximum"] == 1
    top_p = next(s for s in props["top_p"]["anyOf"] if s.get("type") == "number")
    assert (top_p["exclusiveMinimum"], top_p["maximum"]) == (0, 1)
    seed = next(s for s in props["seed"]["anyOf"] if s.get("type") == "integer")
    assert seed["maximum"] == MAX_JSON_SEED
    assert "null" not in str(props["prompt"])  # {"prompt": null} is not schema-valid any more
    assert "description" in props["top_k"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["messages"]["minItems"] == 1 and "Message" in chat["messages"]["items"]["$ref"]
    assert schemas["Message"]["required"] == ["role", "content"]


def test_every_status_is_documented_with_the_error_body_and_no_422():
    paths = _openapi()["paths"]
    completions = paths["/v1/completions"]["post"]["responses"]
    assert sorted(completions) == ["200", "400", "401", "404", "413", "429", "500", "503"]
    for status, response in completions.items():
        if status != "200":
            assert response["content"] == {"application/json": {"schema": {
                "$ref": "#/components/schemas/ErrorResponse"}}}, status
    assert all("422" not in op["responses"] for ops in paths.values() for op in ops.values())
    ok = completions["200"]["content"]
    assert ok["application/json"]["schema"]["$ref"].endswith("/Completion")
    data = ok["text/event-stream"]["itemSchema"]["properties"]["data"]
    assert "/CompletionChunk" in str(data) and "[DONE]" in str(data)
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


def test_with_keys_the_schema_declares_bearer_auth_and_health_stays_open():
    schema = _openapi(("k",))
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schema["security"] == [{"bearer": []}]
    assert schema["paths"]["/health"]["get"]["security"] == []
    assert "security" not in _openapi()


def _output(text: str, token_ids: list[int], finished: bool) -> RequestOutput:
    logprobs = [{t: -0.5, t + 1: -1.5} for t in token_ids]
    return RequestOutput("r", None, [1, 2], [CompletionOutput(0, text, token_ids, logprobs,
                                                              "length" if finished else None)], finished,
                         metrics={"num_steps": 1, "acceptance_per_position": [0.5]})


class _Tokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("num_logprobs", [None, 1])
def test_replies_match_their_models(chat, num_logprobs):
    reply = Reply(chat, "tiny", "srv-1", _Tokenizer(), num_logprobs)
    whole, chunk = (reply_models.ChatCompletion, reply_models.ChatCompletionChunk) if chat else \
        (reply_models.Completion, reply_models.CompletionChunk)
    whole.model_validate(reply.whole(_output("ab", [3, 4], True)), strict=True)
    chunk.model_validate(reply.chunk("a", [3], None, None, first=True), strict=True)
    chunk.model_validate(reply.chunk("", [], None, None), strict=True)
    chunk.model_validate(reply.chunk("b", [4], [{4: -0.1}], _output("ab", [3, 4], True)), strict=True)
    chunk.model_validate(reply.usage_chunk(_output("ab", [3, 4], True)), strict=True)
    with pytest.raises(ValidationError):  # the models do check: a chunk is not a whole answer
        whole.model_validate(reply.chunk("a", [3], None, None))


@pytest.mark.parametrize("body", [{"prompt": None}, {"prompt": ""}, {"prompt": ["a", "b"]}, {"prompt": "x", "n": 2},
                                  {"prompt": "x", "echo": 0}, {"prompt": "x", "seed": MAX_JSON_SEED + 1},
                                  {"prompt": "x", "max_tokens": 5.5}, {"prompt": "x", "stream": 1}])
def test_the_models_refuse_what_the_schema_refuses(body):
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate(body)


def test_integral_floats_are_integers_as_in_json_schema():
    assert CompletionRequest.model_validate({"prompt": [5.0], "max_tokens": 3.0}).max_tokens == 3


@pytest.mark.parametrize("field,value,chat,words", [
    ("top_p", 1.5, False, "SamplingParams.top_p=1.5 must be in (0, 1]"),
    ("top_logprobs", 30, True, "SamplingParams.logprobs=30"),
    ("n", 3, False, "only n=1 is supported"),
    ("logit_bias", {"5": 1.0}, False, "logit_bias is not implemented"),
    ("prompt", ["a", "b"], False, "one prompt per request"),
    ("prompt", [], False, "prompt is empty"),
    ("messages", [{"role": "wizard", "content": "hi"}], True, "role='wizard'"),
    ("response_format", {"type": "xml"}, False, "is not supported"),
])
def test_a_refused_field_is_worded_by_its_own_check(field, value, chat, words):
    assert words in (explain(field, value, chat) or "")


def test_a_valid_chat_body_passes_and_the_app_answers_bad_ones_400_naming_the_field():
    ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    state = ServerState(load=lambda: None, model_name="tiny", max_queued=4)  # type: ignore
    client = TestClient(build_app(state))  # no lifespan, so nothing loads: validation answers first
    r = client.post("/v1/completions", json={"prompt": "x", "temperature": "hot"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "temperature" and "must be a real number" in err["message"]
