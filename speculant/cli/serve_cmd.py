"""``speculant serve``: the OpenAI-compatible server (``speculant.server``) on uvicorn.

The config is checked before the port opens (a bad config exits 2 at once);
the model then loads while ``/health`` answers 503. SIGTERM or SIGINT stops
accepting connections, lets in-flight requests finish for up to
``--shutdown-timeout`` seconds, aborts the rest and exits 0 (a second SIGINT
forces the exit).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

SERVE_MODULES = ("fastapi", "uvicorn", "prometheus_client")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                       description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and "
                                   "/metrics. Select the model with --config FILE and/or --model DIR|FILE.gguf.")
    p.add_argument("--config", help="engine config file (.toml, .yaml)")
    p.add_argument("--model", help="local Hugging Face model directory or .gguf file (overrides model.path)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value, e.g. --set speculative.num_speculative_tokens=3")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the model directory's or file's name)")
    p.add_argument("--max-queued", type=int, default=256,
                   help="requests that may wait for their first step; one more gets 429 with Retry-After "
                        "(default: 256)")
    p.add_argument("--shutdown-timeout", type=int, default=30,
                   help="seconds in-flight requests get to finish on SIGTERM/SIGINT before they are "
                        "aborted (default: 30)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice, one per core)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def _usage_problem(args: argparse.Namespace) -> str | None:
    missing = [m for m in SERVE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        return f"speculant serve needs {', '.join(missing)}: pip install 'speculant[serve]'"
    if not args.config and not args.model:
        return "pass --config FILE (TOML/YAML) or --model DIR|FILE.gguf"
    if args.max_queued < 1:
        return f"--max-queued {args.max_queued}: must be at least 1 (requests that may wait)"
    if not 0 <= args.port <= 65535:
        return f"--port {args.port}: must be in [0, 65535]"
    if args.threads is not None and args.threads < 1:
        return f"--threads {args.threads}: need at least 1 thread; omit it for torch's choice"
    if args.shutdown_timeout < 0:
        return f"--shutdown-timeout {args.shutdown_timeout}: must be >= 0 seconds"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _usage_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from speculant.server.runner import serve_command

    return serve_command(args)
