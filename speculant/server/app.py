"""The FastAPI app: routes, and the model loading behind ``/health``.

The app starts answering at once; the engine loads in a thread meanwhile,
and every route but ``/metrics`` answers 503 (with ``Retry-After``) until it
is ready. Then one engine loop (``speculant.engine.loop``, behind ``admission``)
steps the engine for every connection.
On shutdown (uvicorn stops accepting, lets in-flight requests finish within
its graceful timeout, then cancels them, which aborts them) the loop aborts
whatever is left and stops.

In front of the routes, before any body is read: ``ApiKeyAuth`` (401 without
a valid key, when the server has keys), then ``BodyLimit`` (413 over
``--max-request-bytes``). A prompt certain not to fit ``max_model_len`` is
refused by its length (``PromptLimit``) before it is tokenized; chat
templates are rendered, and prompts tokenized, in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.background import BackgroundTask

from speculant.chat import as_conversations, render
from speculant.engine.grammar import GrammarError
from speculant.engine.llm_engine import LLMEngine
from speculant.server import api_docs
from speculant.server.access import OPEN_PATHS, ApiKeyAuth
from speculant.server.admission import Admission, QueueFull
from speculant.server.body_limit import DEFAULT_MAX_REQUEST_BYTES, BodyLimit
from speculant.server.errors import (
    INVALID_PROMPT,
    INVALID_STRUCTURED_OUTPUT,
    NOT_SUPPORTED_HERE,
    PROMPT_TOO_LONG,
    APIError,
    install_handlers,
)
from speculant.server.explain import validation_message
from speculant.server.metrics import ServerMetrics
from speculant.server.open_requests import OpenRequestCount, OpenRequests
from speculant.server.prompt_limit import PromptLimit
from speculant.server.protocol import ChatCompletionRequest, CompletionRequest
from speculant.server.reply_models import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    Health,
    ModelCard,
    ModelList,
)
from speculant.server.request_params import messages_of, prompt_of, sampling_params
from speculant.server.responses import Reply
from speculant.server.serving import Serving

logger = logging.getLogger(__name__)

LOADING_RETRY_AFTER_S = 5
QUEUE_FULL_RETRY_AFTER_S = 1
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat runs to max_model_len


@dataclass
class ServerState:
    load: Callable[[], LLMEngine]
    model_name: str
    max_queued: int
    on_load_error: Callable[[str], None] = lambda message: None
    api_keys: tuple[str, ...] = ()
    """Empty: no authentication (the command allows that on loopback only)."""
    metrics_public: bool = False
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    request_id_prefix: str = "srv"
    """Request (and response) ids are ``{prefix}-{n}``; several servers behind one endpoint need distinct ones."""
    gather_metrics: Callable[[], Awaitable[bytes]] | None = None
    """``/metrics`` of several servers (Ray Serve replicas: ``speculant.server.ray_serve``); None: this one's."""
    engine: LLMEngine | None = None
    loop: Admission | None = None
    prompt_limit: PromptLimit | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    open_requests: OpenRequestCount = field(default_factory=OpenRequestCount)
    """API requests held, arrival to last byte (``open_requests.py``)."""
    metrics: ServerMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(lambda: self.engine, lambda: self.loop, self.open_requests)

    def load_now(self) -> None:
        """Load in this thread, before the app starts (a Ray Serve replica takes no request before it is
        ready); the app's start then loads nothing. A failure is reported to ``on_load_error``."""
        self._load()

    def _load(self) -> None:
        try:
            engine = self.load()
        except Exception as exc:  # reported to the command, which exits
            logger.exception("loading the model failed")
            self.on_load_error(f"{type(exc).__name__}: {exc}")
            return
        # The first encode may switch off truncation or padding saved with the tokenizer, which
        # mutates it; done here, the encodes that worker threads run side by side only read it.
        engine.tokenizer("warm-up", add_special_tokens=False)
        limit, why_off = PromptLimit.for_tokenizer(engine.tokenizer, engine.max_model_len)
        if why_off:
            logger.warning("prompts are not refused by their length in characters before tokenizing: %s", why_off)
        loop = Admission(engine, self.max_queued, self._on_step, self.request_id_prefix)
        loop.start()
        self.prompt_limit = limit
        self.engine, self.loop = engine, loop
        logger.info("model %r loaded; serving", self.model_name)

    def _on_step(self, seconds: float, outputs: list) -> None:
        self.metrics.step_seconds.observe(seconds)

    def ready(self) -> tuple[LLMEngine, Admission]:
        if self.engine is None or self.loop is None:
            raise APIError(503, "the model is still loading; retry in a few seconds (GET /health answers 200 "
                                "once it is ready)", code="model_loading",
                           headers={"Retry-After": str(LOADING_RETRY_AFTER_S)})
        return self.engine, self.loop

    def check_length(self, prompt: str | list[int], param: str, what: str = "prompt") -> None:
        """400 for a prompt certain not to fit max_model_len, before it is tokenized."""
        if self.prompt_limit is not None:
            self.prompt_limit.check(prompt, param, what)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"model {name!r} does not exist; this server serves {self.model_name!r} "
                                "(GET /v1/models)", param="model", code="model_not_found")


def build_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if state.loop is None:  # not loaded before the app started (as a Ray Serve replica loads)
            threading.Thread(target=state._load, name="speculant-load", daemon=True).start()
        yield
        if state.loop is not None:
            state.loop.stop()

    app = FastAPI(title="Speculant", summary="OpenAI-compatible server", lifespan=lifespan)
    app.state.speculant = state
    install_handlers(app, validation_message)
    open_paths = OPEN_PATHS | ({"/metrics"} if state.metrics_public else set())
    api_docs.install(app, open_paths if state.api_keys else None)
    app.add_middleware(BodyLimit, max_bytes=state.max_request_bytes)
    if state.api_keys:
        app.add_middleware(ApiKeyAuth, keys=state.api_keys, metrics_public=state.metrics_public)
    app.add_middleware(OpenRequests, count=state.open_requests)  # added last: runs first

    @app.get("/health", response_model=Health, responses=api_docs.errors(503))
    def health() -> dict[str, str]:
        state.ready()
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse, responses=api_docs.metrics_responses())
    async def metrics() -> PlainTextResponse:
        text = state.metrics.text() if state.gather_metrics is None else await state.gather_metrics()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", response_model=ModelList, responses=api_docs.errors(*api_docs.GUARDS, 503))
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{name:path}", response_model=ModelCard,
             responses=api_docs.errors(*api_docs.GUARDS, 404, 503))
    def model(name: str) -> dict[str, Any]:
        state.check_model(name)
        return _model_card(state)

    @app.post("/v1/completions", response_model=None,
              responses=api_docs.completion_responses(Completion, CompletionChunk))
    async def completions(body: CompletionRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        state.ready()
        state.check_model(body.model)
        params = sampling_params(body, COMPLETIONS_DEFAULT_MAX_TOKENS)
        prompt = prompt_of(body)
        state.check_length(prompt, "prompt")
        return await _run(state, request, body, prompt, params, chat=False)

    @app.post("/v1/chat/completions", response_model=None,
              responses=api_docs.completion_responses(ChatCompletion, ChatCompletionChunk))
    async def chat(body: ChatCompletionRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        engine, _ = state.ready()
        state.check_model(body.model)
        params = sampling_params(body, engine.max_model_len)
        prompt = await asyncio.to_thread(_render, engine.tokenizer, body)
        state.check_length(prompt, "messages", "the prompt the messages render to")
        return await _run(state, request, body, prompt, params, chat=True)

    return app


def _render(tokenizer: Any, body: ChatCompletionRequest) -> str:
    """The chat prompt, in a worker thread: a template over long messages takes a while."""
    try:
        conversations, _ = as_conversations(messages_of(body))
        return render(tokenizer, conversations[0])
    except (TypeError, ValueError) as exc:
        raise APIError(400, str(exc), param="messages", code=INVALID_PROMPT) from None


def _model_card(state: ServerState) -> dict[str, Any]:
    engine, _ = state.ready()
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "speculant",
            "max_model_len": engine.max_model_len}


async def _run(state: ServerState, request: Request, body: CompletionRequest | ChatCompletionRequest,
               prompt: str | list[int], params: Any, chat: bool) -> dict[str, Any] | StreamingResponse:
    engine, loop = state.ready()
    try:
        stream = await loop.submit(prompt, params)
    except QueueFull as exc:
        state.metrics.finished("rejected")
        raise APIError(429, f"the server is busy: {exc}; retry after {QUEUE_FULL_RETRY_AFTER_S} s",
                       code="queue_full", headers={"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)}) from None
    except GrammarError as exc:  # a schema / grammar that does not compile
        raise APIError(400, str(exc), param="response_format" if body.structured_outputs is None
                       else "structured_outputs", code=INVALID_STRUCTURED_OUTPUT) from None
    except (TypeError, ValueError) as exc:  # the engine's prompt checks (length, token ids), its configuration's
        message = str(exc)
        code = PROMPT_TOO_LONG if message.startswith("prompt has") else \
            INVALID_PROMPT if message.startswith("prompt") else NOT_SUPPORTED_HERE
        param = "speculative" if message.startswith("SamplingParams.speculative") else \
            None if code == NOT_SUPPORTED_HERE else "messages" if chat else "prompt"
        raise APIError(400, message, param=param, code=code) from None
    except RuntimeError as exc:  # shutting down
        raise APIError(503, str(exc), code="shutting_down") from None
    reply = Reply(chat, state.model_name, stream.request_id, engine.tokenizer, params.logprobs)
    serving = Serving(loop, state.metrics, stream, reply)
    if not body.stream:
        return await serving.whole(request)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return StreamingResponse(serving.events(include_usage), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"}, background=BackgroundTask(serving.cleanup))
