"""``speculant serve --ray``: the OpenAI app as Ray Serve replicas, each with its own engine.

``SpeculantReplica`` is a Serve deployment whose ASGI app is this package's
own FastAPI app (``build_app``, through ``@serve.ingress`` with the app built
per replica by ``__serve_build_asgi_app__``): the same routes, API keys, body
limit, streaming and disconnect handling as ``speculant serve``, behind
Serve's HTTP proxy. A replica loads its engine in its constructor, so Serve
routes nothing to it before it can answer; the app's shutdown (Serve runs its
lifespan) stops the engine loop. ``/metrics`` answers for every
replica through a ``MetricsHub`` actor (``speculant.server.metrics_hub``).

``deploy`` starts Serve (``http_options`` host and port) on the cluster at
``$RAY_ADDRESS`` or a local one, creates the hub and runs the application
(``--replicas N``, or ``--autoscale MIN:MAX`` on ongoing requests), returning
once every replica is up; ``undeploy`` removes both.

``SPECULANT_SERVE_KILL_FILE=PATH`` (fault injection for the tests): once PATH
exists, one replica holding API requests, none new for ``KILL_QUIET_S`` (whichever
claims ``PATH.claimed`` first, where it writes how many it held: ``open_requests.py``)
exits abruptly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import ray
import torch
from ray import serve

from speculant.config.models import ConfigError, EngineConfig
from speculant.engine.llm_engine import LLMEngine
from speculant.ray_cluster import connect
from speculant.server.app import ServerState, build_app
from speculant.server.body_limit import DEFAULT_MAX_REQUEST_BYTES
from speculant.server.metrics_hub import HUB_NAMESPACE, REPORT_INTERVAL_S, MetricsHub, exposition
from speculant.server.runner import config_from_args

logger = logging.getLogger(__name__)

APP_NAME = "speculant"
KILL_ENV = "SPECULANT_SERVE_KILL_FILE"
KILL_QUIET_S = 0.3


@dataclass(frozen=True)
class ReplicaOptions:
    """What every replica's server is started with (the ``speculant serve`` options)."""

    model_name: str
    max_queued: int = 256
    api_keys: tuple[str, ...] = ()
    metrics_public: bool = False
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    threads: int = 1
    hub_name: str = f"{APP_NAME}-metrics"


@serve.ingress()
class SpeculantReplica:
    def __init__(self, config: EngineConfig, source: str, options: ReplicaOptions) -> None:
        torch.set_num_threads(options.threads)
        self.replica = serve.get_replica_context().replica_id.unique_id
        engine = LLMEngine(config, source=source)
        self.hub = ray.get_actor(options.hub_name, namespace=HUB_NAMESPACE)
        self.state = ServerState(lambda: engine, options.model_name, options.max_queued, api_keys=options.api_keys,
                                 metrics_public=options.metrics_public, max_request_bytes=options.max_request_bytes,
                                 request_id_prefix=f"srv-{self.replica}", gather_metrics=self.gather_metrics)
        self.state.load_now()  # the tokenizer warm-up and the engine thread: ready before Serve routes here
        if self.state.loop is None:  # Serve marks the replica failed rather than routing to a 503-only app
            raise RuntimeError(f"replica {self.replica}: the engine did not start (see the replica's log)")
        # constructed inside Serve's async wrapper: its event loop runs the reports
        self._reporter = asyncio.get_running_loop().create_task(self._report_forever())
        if os.environ.get(KILL_ENV):
            threading.Thread(target=_die_when_flagged, args=(os.environ[KILL_ENV], self.state), daemon=True).start()

    def __serve_build_asgi_app__(self) -> Any:
        return build_app(self.state)

    async def _report(self) -> None:
        await self.hub.report.remote(self.replica, list(self.state.metrics.registry.collect()))

    async def _report_forever(self) -> None:
        while True:
            try:
                await self._report()
            except Exception:  # a hub that is gone costs metrics, never requests
                logger.warning("replica %s: reporting metrics to the hub failed", self.replica, exc_info=True)
            await asyncio.sleep(REPORT_INTERVAL_S)

    async def gather_metrics(self) -> bytes:
        """Every replica's last report, this one's fresh; this one's alone if the hub cannot be reached."""
        try:
            await self._report()
            return exposition(await self.hub.snapshot.remote())
        except Exception:  # a scrape still answers, with what this replica knows
            logger.warning("replica %s: the metrics hub did not answer; /metrics shows this replica only",
                           self.replica, exc_info=True)
            return exposition({self.replica: list(self.state.metrics.registry.collect())})


def _die_when_flagged(path: str, state: ServerState) -> None:
    """Once ``path`` exists: wait until this replica holds requests and none has arrived for
    ``KILL_QUIET_S`` (a burst sent at once has landed: none is still on its way here), then claim
    ``path.claimed``, write how many requests are open and exit abruptly. What a replica holds counts
    from arrival to the answer's last byte (``open_requests.py``): a request not yet handed to its
    engine, or finished but not yet answered in full, is lost with it too."""
    open_ = state.open_requests
    while not os.path.exists(path):
        time.sleep(0.02)
    seen, since = open_.arrived, time.monotonic()
    while True:
        if os.path.exists(path + ".claimed"):
            return
        if open_.arrived != seen:
            seen, since = open_.arrived, time.monotonic()
        elif open_.value > 0 and time.monotonic() - since >= KILL_QUIET_S:
            break
        time.sleep(0.02)
    try:
        fd = os.open(path + ".claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(open_.value).encode())
    os.close(fd)
    os._exit(1)  # as abrupt as a lost node


def parse_autoscale(text: str) -> tuple[int, int]:
    """``MIN:MAX`` -> (min, max); ValueError naming the option and the fix."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = -1
    if not sep or lo < 0 or hi < max(lo, 1):
        raise ValueError(f"--autoscale {text}: expected MIN:MAX replicas with 0 <= MIN <= MAX and MAX >= 1, "
                         "e.g. --autoscale 1:4")
    return lo, hi


def deploy(config: EngineConfig, source: str, options: ReplicaOptions, *, replicas: int = 1,
           autoscale: tuple[int, int] | None = None, cpus_per_replica: float = 1.0, host: str = "127.0.0.1",
           port: int = 8000, shutdown_timeout: float = 30.0) -> str:
    """Run the application; returns its URL once every replica is up."""
    connect()
    ray.remote(MetricsHub).options(name=options.hub_name, namespace=HUB_NAMESPACE, lifetime="detached",
                                   get_if_exists=True, num_cpus=0).remote()
    serve.start(http_options={"host": host, "port": port})
    # A replica takes what it can batch and queue; Serve's router holds the rest.
    scaling: dict[str, Any] = {"num_replicas": replicas}
    if autoscale is not None:
        scaling = {"autoscaling_config": {"min_replicas": autoscale[0], "max_replicas": autoscale[1],
                                          "initial_replicas": max(autoscale[0], 1),
                                          "target_ongoing_requests": config.scheduler.max_num_seqs}}
    deployment = cast(Any, serve.deployment(SpeculantReplica)).options(
        ray_actor_options={"num_cpus": cpus_per_replica}, max_ongoing_requests=options.max_queued,
        graceful_shutdown_timeout_s=shutdown_timeout, **scaling)
    serve.run(deployment.bind(config, source, options), name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port}"


def undeploy(options: ReplicaOptions) -> None:
    serve.delete(APP_NAME)
    with contextlib.suppress(ValueError):  # already gone
        ray.kill(ray.get_actor(options.hub_name, namespace=HUB_NAMESPACE))


def replica_threads(cpus_per_replica: float) -> int:
    return max(1, math.ceil(cpus_per_replica))


def serve_on_ray(args: argparse.Namespace) -> int:
    """``speculant serve --ray`` after its argument checks: deploy, serve until SIGTERM/SIGINT, remove."""
    try:
        config, source = config_from_args(args)
        autoscale = parse_autoscale(args.autoscale) if args.autoscale else None
    except (ConfigError, ValueError, OSError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or Path(config.model.path).name.removesuffix(".gguf")
    options = ReplicaOptions(name, args.max_queued, args.api_keys, args.metrics_public,
                             args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
                             replica_threads(args.cpus_per_replica))
    try:
        url = deploy(config, source, options, replicas=args.replicas, autoscale=autoscale,
                     cpus_per_replica=args.cpus_per_replica, host=args.host, port=args.port,
                     shutdown_timeout=args.shutdown_timeout)
    except Exception as exc:  # noqa: BLE001 -- a replica that did not start, a port in use: reported, exit 1
        print(f"error: the deployment did not start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()  # handlers set after ray.init, which installs its own
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        scale = f"{autoscale[0]}-{autoscale[1]} replicas" if autoscale else f"{args.replicas} replica(s)"
        print(f"serving {name!r} on {url} ({scale} on Ray Serve); SIGTERM or Ctrl-C stops", file=sys.stderr)
        while not stop.wait(1.0):  # a timed wait lets the signal handlers run
            pass
    finally:
        undeploy(options)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
