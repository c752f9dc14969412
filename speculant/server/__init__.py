"""``speculant serve``: an OpenAI-compatible HTTP server (FastAPI on uvicorn).

``app`` (routes, loading, ``/health``), ``protocol`` (request bodies ->
SamplingParams), ``responses`` (OpenAI response shapes, the ``speculant``
speculation summary), ``serving`` (one request: whole or SSE, disconnects),
``admission`` (bounded admission into the engine loop), ``metrics``
(Prometheus), ``errors`` (OpenAI's error shape), ``access`` (API keys),
``body_limit`` (``--max-request-bytes``), ``prompt_limit`` (prompts refused
by length before tokenizing). Needs the ``serve`` extra.
"""
