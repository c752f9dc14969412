"""Run the app on uvicorn until SIGTERM/SIGINT, then shut down gracefully.

uvicorn stops accepting connections, waits up to ``shutdown_timeout``
seconds for in-flight responses, cancels the rest (which aborts their
requests) and runs the app's shutdown (the engine loop stops). uvicorn
itself re-raises a caught signal after that, so the process would die of
it; ``GracefulServer`` only records it, and ``run_server`` returns normally:
a server that was asked to stop and stopped cleanly exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import uvicorn

from speculant.config.compat import build_config
from speculant.config.models import ConfigError, EngineConfig, apply_overrides, read_config
from speculant.engine.llm_engine import LLMEngine
from speculant.server.app import ServerState, build_app
from speculant.server.body_limit import DEFAULT_MAX_REQUEST_BYTES


class GracefulServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self._stop) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for in-flight requests
        self.should_exit = True


def run_server(config: EngineConfig, source: str, model_name: str, *, host: str, port: int, max_queued: int,
               shutdown_timeout: int, log_level: str = "info", api_keys: tuple[str, ...] = (),
               metrics_public: bool = False, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> str | None:
    """Serve until stopped; returns None after a clean stop, or why it could not serve."""
    errors: list[str] = []
    server: GracefulServer | None = None

    def load_failed(message: str) -> None:
        errors.append(f"the model did not load: {message}")
        if server is not None:
            server.should_exit = True

    state = ServerState(lambda: LLMEngine(config, source=source), model_name, max_queued, load_failed,
                        api_keys=api_keys, metrics_public=metrics_public, max_request_bytes=max_request_bytes)
    uv_config = uvicorn.Config(build_app(state), host=host, port=port, log_level=log_level,
                               timeout_graceful_shutdown=round(shutdown_timeout), lifespan="on")
    server = GracefulServer(uv_config)
    server.run()
    if errors:
        return errors[0]
    if not server.started:
        return f"could not serve on {host}:{port} (see the log above: port in use?)"
    return None


def serve_command(args: argparse.Namespace) -> int:
    """``speculant serve`` after its argument checks: the config is built and
    checked before the port opens (exit 2 naming the problem), then served
    (exit 0 after a clean stop, 1 if the model did not load or the port did not open)."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        config, source = config_from_args(args)
    except (ConfigError, ValueError, OSError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or Path(config.model.path).name.removesuffix(".gguf")
    error = run_server(config, source, name, host=args.host, port=args.port, max_queued=args.max_queued,
                       shutdown_timeout=args.shutdown_timeout, log_level=args.log_level, api_keys=args.api_keys,
                       metrics_public=args.metrics_public,
                       max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def config_from_args(args: argparse.Namespace) -> tuple[EngineConfig, str]:
    """``--config`` (with ``--model`` replacing model.path) or ``--model``, then ``--set``."""
    if args.config:
        data = read_config(args.config, args.overrides)
        if args.model:
            data.setdefault("model", {})["path"] = args.model
        return build_config(data, str(args.config)), str(args.config)
    data = apply_overrides({"model": {"path": args.model}}, args.overrides)
    return build_config(data, "--model/--set"), "--model/--set"
