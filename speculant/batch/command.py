"""``speculant batch`` after its argument checks: config, plan, run, summary.

The config is built and checked before any record is written (exit 2 naming
the problem, as ``speculant serve``); the input is read and the output's
answered records counted; then the lines run locally or on Ray, and one JSON
line sums the job up (exit 1 if the job could not finish: the output then
holds every record before the first missing one, and a rerun finishes it).

Locally the check comes first and the engine loads after it. With ``--ray``
the config's schema is checked first; then the job starts (its actors take
seconds to start and load their engines) and the driver runs the rest of the
check meanwhile (the plugins' rules: loading them takes ~1 s); if that check
fails, the job is cancelled (``RowStream.cancel``: its actors end) before
anything is written. The job's summary counts its seconds from the start of
the job, Ray's start included.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator

from speculant.batch import job
from speculant.batch.lines import InputLine
from speculant.batch.ray_job import RayJob  # imports Ray only when a Ray job runs
from speculant.batch.ray_stream import RowStream
from speculant.batch.runner import BatchRunner, Record
from speculant.config.compat import parse_config, validate_config
from speculant.config.models import ConfigError, EngineConfig, apply_overrides, read_config


def engine_config(args: argparse.Namespace, check: bool = True) -> tuple[EngineConfig, str]:
    """``--config`` (with ``--model`` replacing model.path) or ``--model``, then ``--set``; with ``check``
    False, its schema only (``validate_config`` checks the rest)."""
    if args.config:
        data, source = read_config(args.config, args.overrides), str(args.config)
        if args.model:
            data.setdefault("model", {})["path"] = args.model
    else:
        data, source = apply_overrides({"model": {"path": args.model}}, args.overrides), "--model/--set"
    config = parse_config(data, source)
    return (validate_config(config, source=source) if check else config), source


def _start_and_check(ray_job: RayJob, config: EngineConfig, source: str, lines: list[InputLine]) -> RowStream | None:
    """Start ``ray_job`` and finish checking ``config`` while its actors start; a refused config cancels
    the job (its actors end) and raises."""
    rows = ray_job.start(lines)
    try:
        validate_config(config, source=source)
    except ConfigError:
        if rows is not None:
            rows.cancel()
        ray_job.close()
        raise
    return rows


def batch_command(args: argparse.Namespace) -> int:
    try:
        config, source = engine_config(args, check=not args.ray)
        plan = job.plan(args.input, args.output)
    except (ConfigError, ValueError, OSError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    ray_job = None
    if args.ray:
        ray_job = RayJob(config, source, args.replicas, args.cpus_per_replica, args.ray_batch_size)
        try:
            rows = _start_and_check(ray_job, config, source, plan.to_run)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except (OSError, RuntimeError) as exc:  # no cluster at $RAY_ADDRESS, say
            ray_job.close()
            print(f"error: {exc}", file=sys.stderr)
            return 1

        def run(lines: list[InputLine]) -> Iterator[tuple[int, Record]]:
            return RayJob.records(rows)
    else:
        def run(lines: list[InputLine]) -> Iterator[tuple[int, Record]]:
            import torch  # here only: a --ray driver runs no engine (it skips the ~2 s of model code imports)

            from speculant.engine.llm_engine import LLMEngine

            if args.threads is not None:
                torch.set_num_threads(args.threads)
            return BatchRunner(LLMEngine(config, source=source)).run(lines)
    try:
        summary = job.write(plan, args.output, run, progress=not args.no_progress, started=started)
    except (ConfigError, ValueError, OSError, TypeError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if ray_job is not None:
            ray_job.close()
    print(json.dumps({"written": summary.num_written, "errors": summary.num_errors,
                      "skipped": summary.num_skipped, "seconds": round(summary.seconds, 3)}))
    return 0
