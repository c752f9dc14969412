"""Errors in OpenAI's JSON shape, with the status that fits the cause.

Every error the server answers is ``{"error": {"message", "type", "param",
"code"}}``: 400 for a request the server cannot run as sent (malformed JSON,
wrong types, unknown fields, parameters ``SamplingParams`` refuses, a prompt
too long), 401 without a valid API key (``--api-key``), 404 for an unknown
model or route, 413 for a body over ``--max-request-bytes``, 429 when the
waiting queue is full, 503 while the model loads, 500 when the engine failed
the request (the message names the request, the stage and, where one ran,
the plugin).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
               413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
               503: "service_unavailable"}


class APIError(Exception):
    """An error answered to the client as-is (status, OpenAI error body, headers)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable sentence per problem pydantic found in the body, and the
    first offending field (OpenAI's ``param``)."""
    parts, param = [], None
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        field = ".".join(loc) or "body"
        param = param or field
        kind = err.get("type", "")
        if kind == "json_invalid":
            ctx = err.get("ctx", {}).get("error", "")
            parts.append(f"the request body is not valid JSON ({ctx} at character {field}); send a JSON object")
            param = None
        elif kind == "extra_forbidden":
            parts.append(f"unknown field {field!r}; remove it (see the API reference for the fields "
                         "this endpoint accepts)")
        elif kind == "missing":
            parts.append(f"field {field!r} is required")
        elif field == "body" and kind in ("model_attributes_type", "dict_type"):
            parts.append("the request body must be a JSON object")
        else:
            parts.append(f"field {field!r}: {err.get('msg', 'invalid value')} (got {err.get('input')!r})")
    return "; ".join(parts) or "invalid request", param


def install_handlers(app: FastAPI) -> None:
    """Answer every error raised in a route in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = "no such route; the server answers /v1/completions, /v1/chat/completions, " \
                      "/v1/models, /health and /metrics"
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))
