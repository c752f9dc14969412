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

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
               413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
               503: "service_unavailable"}


PROMPT_TOO_LONG = "prompt_too_long"
INVALID_PROMPT = "invalid_prompt"
INVALID_STRUCTURED_OUTPUT = "invalid_structured_output"
CONFLICTING_PARAMETERS = "conflicting_parameters"
NOT_SUPPORTED_HERE = "not_supported_by_this_configuration"
BEYOND_SCHEMA_CODES = frozenset({PROMPT_TOO_LONG, INVALID_PROMPT, INVALID_STRUCTURED_OUTPUT, CONFLICTING_PARAMETERS,
                                 NOT_SUPPORTED_HERE})
"""``code`` of a 400 for a request the published schema allows but the server cannot run as sent: a prompt
longer than ``max_model_len`` or holding token ids outside the vocabulary (``invalid_prompt``), a JSON schema,
regex or grammar that does not compile, fields that contradict each other, or an option this server's
speculative configuration cannot honour. Every other 400 is a body the schema itself refuses."""


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


def install_handlers(app: FastAPI, describe: Callable[[RequestValidationError, bool], tuple[str, str | None]]) -> None:
    """Answer every error raised in a route in OpenAI's shape; ``describe(exc, chat)`` words a body the
    request models refused (the message, and the field it is about)."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe(exc, request.url.path.endswith("/chat/completions"))
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = "no such route; the server answers /v1/completions, /v1/chat/completions, " \
                      "/v1/models, /health and /metrics"
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))
