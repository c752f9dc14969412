"""``speculant batch --ray``: the same job over Ray Data, one engine per actor.

The lines to run become a dataset (``from_items``, one row per line: its
number and raw text; one block per batch), ``map_batches`` hands the blocks to
a pool of ``Predictor`` actors (``ActorPoolStrategy(size=replicas)``,
``num_cpus`` each), each of which builds its own engine once; the records come
back as rows (number, record as JSON text) and ``job.write`` puts them in
input order. Greedy lines give the same records as a local run.

An actor's engine is kept fed across batches: Ray calls an actor from several
threads at once (``max_concurrent_calls_per_actor``, true multi-threading),
each call queues its batch into the actor's one ``LineFeed`` (the engine loop
stepping the engine in its own thread, fed by ``BatchRunner`` as the local job is) and returns
when its own records are in. An actor holds enough batches to fill its
engine's in-flight window (twice ``scheduler.max_num_seqs``) plus one, so a
batch's last requests run beside the next batch's first ones instead of
alone: the engine runs as many requests per step as a local one. Batches are
``max_num_seqs / 2`` lines by default: small enough to spread a job evenly
over several actors, and the engine does not see their edges. (Before, an
actor ran one batch to the end before taking the next: 41% more engine steps
than the local run on the benchmark job; the Ray path was 44-55% slower.)

The driver runs no engine: its config check loads the plugins (torch with
them) but no model code (neither our runner nor transformers' model
classes: ``tests/test_import_graph.py``); each actor imports and loads the
engine once, when it starts (its process, imports and engine load are
Ray's remaining fixed cost: ``benchmarks/ray_breakdown.py``).

Why not ``read_json``: pyarrow's JSON reader fails the whole read on one
malformed line and infers one schema for every line (``stop`` a string on
one line and a list on the next is an error), while here a bad line must
become an error record and nothing else. The driver already reads the file
(to skip the lines a rerun has answered), so it hands Ray the raw lines.

A killed actor: Ray restarts it (``max_restarts``) and retries the batches it
held (``max_task_retries``); a batch's records are returned only when all of
it is done, so a batch is either redone whole or delivered once. Both are
bounded (``MAX_RESTARTS``), so an engine that dies on every start fails the
job instead of looping; the output then holds every line before the first
one missing, and a rerun finishes it.

``SPECULANT_BATCH_KILL_AFTER=N:PATH`` (fault injection for the tests): the
first actor to have run N lines exits abruptly before returning its batches,
once per job (whoever creates PATH first).
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from speculant.batch.line_feed import LineFeed
from speculant.batch.lines import InputLine
from speculant.batch.ray_stream import RowStream
from speculant.batch.runner import Record
from speculant.config.models import EngineConfig
from speculant.ray_cluster import connect

MAX_RESTARTS = 3
"""Restarts of one actor, and retries of one batch, before the job fails."""
MAX_CALLS = 64
"""Batches one actor holds at most (its threads), whatever the batch size."""
KILL_ENV = "SPECULANT_BATCH_KILL_AFTER"


class Predictor:
    """One Ray Data actor: an engine built once, then batches of lines in, records out; called from
    several threads at once, every call feeding the one ``LineFeed``."""

    def __init__(self, config: EngineConfig, source: str, threads: int) -> None:
        import torch  # in the actor only: the driver runs no engine

        from speculant.engine.llm_engine import LLMEngine

        torch.set_num_threads(threads)
        self.loop = LineFeed(LLMEngine(config, source=source))
        self.lock = threading.Lock()
        self.num_done = 0
        self.kill_after, self.kill_flag = _kill_setting(os.environ.get(KILL_ENV))

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        lines = [InputLine(int(n), str(t)) for n, t in zip(batch["number"], batch["text"])]
        records = sorted(self.loop.run(lines), key=lambda pair: pair[0])
        with self.lock:
            self.num_done += len(lines)
            kill = self.kill_after is not None and self.num_done >= self.kill_after and _claim(self.kill_flag)
        if kill:
            os._exit(1)  # as abrupt as a lost node: no cleanup, none of its batches is returned
        return {"number": [n for n, _ in records], "record": [json.dumps(r, ensure_ascii=False) for _, r in records]}


def _kill_setting(value: str | None) -> tuple[int | None, str]:
    if not value:
        return None, ""
    count, _, path = value.partition(":")
    return int(count), path


def _claim(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


class RayJob:
    def __init__(self, config: EngineConfig, source: str, replicas: int, cpus_per_replica: float,
                 batch_size: int | None = None) -> None:
        self.config, self.source = config, source
        self.replicas, self.cpus_per_replica = replicas, cpus_per_replica
        in_flight = 2 * config.scheduler.max_num_seqs  # what the local runner (and each actor's) keeps running
        self.batch_size = batch_size or max(1, config.scheduler.max_num_seqs // 2)
        # batches an actor holds: enough to keep its engine's in-flight window full, plus one queued behind
        self.calls_per_actor = min(MAX_CALLS, math.ceil(in_flight / self.batch_size) + 1)
        self.owns_connection = False
        """True once ``start`` has connected this process to Ray (it was not before): ``close`` disconnects."""

    def connect(self) -> None:
        self.owns_connection = connect() or self.owns_connection

    def close(self) -> None:
        """Disconnect if ``connect`` connected: Ray ends this driver's job and its actors (a started job
        that is no longer wanted stops here), and a cluster it started. Doing it here rather than at the
        interpreter's exit also saves the driver ~1 s (Ray's exit hook waits on the job's threads)."""
        if self.owns_connection:
            import ray

            ray.shutdown()
            self.owns_connection = False

    def start(self, lines: list[InputLine]) -> RowStream | None:
        """Start the job on Ray: its actors start now, while the caller goes on (``RowStream``); None
        for no lines (no Ray then)."""
        if not lines:
            return None
        import ray
        from ray.data import ActorPoolStrategy, DataContext

        self.connect()
        DataContext.get_current().enable_progress_bars = False  # the job has its own bar
        items = [{"number": line.number, "text": line.text} for line in lines]
        # one block per batch; map_batches(batch_size=None) hands each block over whole, as one call
        source = ray.data.from_items(items, override_num_blocks=math.ceil(len(items) / self.batch_size))
        with warnings.catch_warnings():
            # Ray 2.60 takes actor options only as (deprecated) **ray_remote_args; a later Ray that names
            # them takes the same call
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*", category=DeprecationWarning)
            pool = ActorPoolStrategy(size=self.replicas, max_tasks_in_flight_per_actor=self.calls_per_actor,
                                     max_concurrent_calls_per_actor=self.calls_per_actor,
                                     enable_true_multi_threading=True)
            ds = source.map_batches(
                Predictor, batch_size=None, compute=pool,
                num_cpus=self.cpus_per_replica, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS,
                fn_constructor_kwargs={"config": self.config, "source": self.source,
                                       "threads": max(1, math.ceil(self.cpus_per_replica))})
        return RowStream(ds)

    @staticmethod
    def records(rows: RowStream | None) -> Iterator[tuple[int, Record]]:
        """A started job's records, as they come (``job.Source``'s contract)."""
        for row in rows or ():
            yield int(row["number"]), json.loads(row["record"])
