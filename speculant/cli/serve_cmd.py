"""``speculant serve``: the OpenAI-compatible server (``speculant.server``) on uvicorn.

The config is checked before the port opens (a bad config exits 2 at once);
the model then loads while ``/health`` answers 503. SIGTERM or SIGINT stops
accepting connections, lets in-flight requests finish for up to
``--shutdown-timeout`` seconds, aborts the rest and exits 0 (a second SIGINT
forces the exit).

Exposure: with ``--api-key`` (repeatable) or ``SPECULANT_API_KEY`` (keys
separated by commas; read only when no ``--api-key`` is given) every endpoint
but ``/health`` (and ``/metrics`` with ``--metrics-public``) needs
``Authorization: Bearer <key>``. Listening beyond loopback without a key is
refused at start unless ``--allow-unauthenticated`` says something in front
of the server guards it. ``--max-request-bytes`` bounds a request body.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import os
import sys
from collections.abc import Mapping

SERVE_MODULES = ("fastapi", "uvicorn", "prometheus_client")
KEY_ENV = "SPECULANT_API_KEY"
DEFAULT_MAX_REQUEST_BYTES_HELP = "4 MiB = 4194304"  # speculant.server.body_limit.DEFAULT_MAX_REQUEST_BYTES


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
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health (401 otherwise); "
                        f"repeat for several keys (default: ${KEY_ENV}, keys separated by commas)")
    p.add_argument("--metrics-public", action="store_true",
                   help="with API keys: let /metrics be scraped without one")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve on a --host beyond loopback without an API key (only behind something that "
                        "guards it: a proxy with its own authentication, a firewall)")
    p.add_argument("--max-request-bytes", type=int, default=None, metavar="N",
                   help="largest request body accepted; a larger one gets 413 before it is read "
                        f"(default: {DEFAULT_MAX_REQUEST_BYTES_HELP})")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice, one per core)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    ray = p.add_argument_group("Ray", "serve as Ray Serve replicas behind Serve's proxy, one engine each "
                                      "(needs speculant[ray])")
    ray.add_argument("--ray", action="store_true",
                     help="deploy on Ray Serve: the cluster at $RAY_ADDRESS, or else a local one on this machine")
    ray.add_argument("--replicas", type=int, default=1, help="replicas (engines) side by side (default: 1)")
    ray.add_argument("--autoscale", metavar="MIN:MAX", default=None,
                     help="let Serve scale between MIN and MAX replicas on ongoing requests (instead of --replicas)")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0,
                     help="CPUs Ray reserves for each replica; its torch threads are this rounded up (default: 1)")
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
    if args.max_request_bytes is not None and args.max_request_bytes < 1:
        return f"--max-request-bytes {args.max_request_bytes}: must be at least 1 byte; omit it for the default " \
               f"({DEFAULT_MAX_REQUEST_BYTES_HELP})"
    if args.ray:
        if importlib.util.find_spec("ray") is None:
            return "--ray needs Ray: pip install 'speculant[ray]'"
        if args.replicas < 1:
            return f"--replicas {args.replicas}: need at least 1 replica"
        if not args.cpus_per_replica > 0:
            return f"--cpus-per-replica {args.cpus_per_replica}: must be > 0 (fractions such as 0.5 are allowed)"
        if args.threads is not None:
            return "--threads does not apply with --ray: each replica runs --cpus-per-replica threads (rounded up)"
    elif args.replicas != 1 or args.autoscale or args.cpus_per_replica != 1.0:
        return "--replicas, --autoscale and --cpus-per-replica only apply with --ray; add --ray or drop them"
    if not args.api_keys and not args.allow_unauthenticated and not is_loopback(args.host):
        return f"--host {args.host} listens beyond this machine and the server has no API key, so anyone who " \
               f"can reach it could use it: pass --api-key KEY (or set {KEY_ENV}), or --allow-unauthenticated " \
               "if something in front of the server (a proxy with authentication, a firewall) guards it"
    return None


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); any other name may reach beyond this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def api_keys(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The keys of ``--api-key``, or else of ``$SPECULANT_API_KEY`` (comma-separated); raises
    ValueError naming the option and the problem (never the key itself)."""
    if args.api_key:
        keys, where = list(args.api_key), "--api-key"
    elif environ.get(KEY_ENV):
        keys, where = [k.strip() for k in environ[KEY_ENV].split(",")], KEY_ENV
    else:
        return ()
    for i, key in enumerate(keys, 1):
        if not key:
            raise ValueError(f"{where}: key {i} of {len(keys)} is empty; an empty key would protect nothing"
                             + (" (remove the stray comma)" if where == KEY_ENV else ""))
        if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
            raise ValueError(f"{where}: key {i} of {len(keys)} holds a space or a character outside printable "
                             "ASCII, which an HTTP header cannot carry; use letters, digits and punctuation")
    return tuple(keys)


def run(args: argparse.Namespace) -> int:
    try:
        args.api_keys = api_keys(args, os.environ)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = _usage_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.ray:
        from speculant.server.ray_serve import serve_on_ray

        return serve_on_ray(args)
    from speculant.server.runner import serve_command

    return serve_command(args)
