"""What each route may answer, for ``/openapi.json`` and ``/docs``.

Every status the server can send is documented with the OpenAI error body
(``ErrorResponse``): 400 for a body it refuses (malformed JSON, wrong types,
values out of range, unknown fields, and the causes in
``errors.BEYOND_SCHEMA_CODES``), 401 without a valid API key (when the
server has keys), 404 for an unknown model, 413 for a body over
``--max-request-bytes``, 429 when the queue is full, 500 when the engine
failed the request, 503 while the model loads or the server stops. Streamed
completions are ``text/event-stream``: each event's ``data`` is a chunk (or,
for a request that failed mid-stream, an error body), the last is
``[DONE]``. ``/metrics`` is Prometheus text.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from speculant.server.errors import BEYOND_SCHEMA_CODES
from speculant.server.reply_models import ChatCompletionChunk, CompletionChunk, ErrorResponse

ERRORS = {
    400: "The request cannot run as sent: the message names the field and the fix. A body the schema refuses, "
         "or (``code``) one it allows that this server cannot run: " + ", ".join(sorted(BEYOND_SCHEMA_CODES)) + ".",
    401: "No valid API key (only when the server was started with --api-key); send 'Authorization: Bearer <key>'.",
    404: "No such model (GET /v1/models lists the one served).",
    413: "The body is over the server's --max-request-bytes.",
    429: "The waiting queue is full; retry after the Retry-After header's seconds.",
    500: "The engine failed this request; the message names the request and the stage.",
    503: "The model is still loading (retry after the Retry-After header's seconds) or the server is stopping.",
}

GUARDS = (401, 413)
"""Statuses every route but /health may answer, from the middleware in front of them."""

SSE_DONE = "[DONE]"


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorResponse, "description": ERRORS[s]} for s in statuses}


def sse_content(chunk: type[BaseModel]) -> dict[str, Any]:
    """``text/event-stream`` whose events carry ``chunk`` as JSON (an ``ErrorResponse`` for a failure), then
    ``[DONE]``: OpenAPI 3.2's ``itemSchema``, as FastAPI writes it for its own event streams."""
    ref = {"$ref": f"#/components/schemas/{chunk.__name__}"}
    payload = {"type": "string", "contentMediaType": "application/json",
               "contentSchema": {"anyOf": [ref, {"$ref": "#/components/schemas/ErrorResponse"}]}}
    data = {"anyOf": [{"const": SSE_DONE}, payload]}
    return {"itemSchema": {"type": "object", "required": ["data"], "properties": {"data": data}}}


def completion_responses(whole: type[BaseModel], chunk: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The responses of a completion route: the whole answer as JSON, or (``stream: true``) an event stream."""
    ok = {"model": whole, "description": f"A {whole.__name__} (JSON), or with stream=true a stream of "
                                         f"{chunk.__name__} events ending with data: {SSE_DONE}",
          "content": {"text/event-stream": sse_content(chunk)}}
    return {200: ok, **errors(400, *GUARDS, 404, 429, 500, 503)}


def metrics_responses() -> dict[int | str, dict[str, Any]]:
    text = {"text/plain": {"schema": {"type": "string"}}}
    return {200: {"description": "Prometheus text exposition format 0.0.4", "content": text}, **errors(*GUARDS)}


def install(app: FastAPI, open_paths: frozenset[str] | None) -> None:
    """Make ``app.openapi()`` tell the truth: the chunk models the event streams refer to, no 422 (a refused
    body is a 400), and, where the server has API keys (``open_paths`` not None), bearer authentication on
    every route but ``open_paths``."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes,
                                 separate_input_output_schemas=False)
            app.openapi_schema = _truthful(schema, open_paths)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _truthful(schema: dict[str, Any], open_paths: frozenset[str] | None) -> dict[str, Any]:
    found = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (CompletionChunk, ChatCompletionChunk):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in js.pop("$defs", {}).items():
            found.setdefault(name, sub)
        found.setdefault(model.__name__, js)
    for name in ("HTTPValidationError", "ValidationError"):
        found.pop(name, None)
    error_json = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.get("responses", {})
            responses.pop("422", None)
            for status, response in responses.items():
                if int(status) >= 400:  # JSON whatever the route's own media type (/metrics: text/plain)
                    response["content"] = error_json
            if open_paths is not None and path in open_paths:
                operation["security"] = []
    if open_paths is not None:
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
    return schema
