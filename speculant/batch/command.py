"""``speculant batch`` after its argument checks: config, plan, run, summary.

The config is built and checked before any engine loads (exit 2 naming the
problem, as ``speculant serve``); the input is read and the output's answered
records counted; then the lines run locally or on Ray, and one JSON line
sums the job up (exit 1 if the job could not finish: the output then holds
every record before the first missing one, and a rerun finishes it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

from speculant.batch import job
from speculant.batch.lines import InputLine
from speculant.batch.ray_job import RayJob  # imports Ray only when a Ray job runs
from speculant.batch.runner import BatchRunner, Record
from speculant.config.compat import build_config
from speculant.config.models import ConfigError, EngineConfig, apply_overrides, read_config


def engine_config(args: argparse.Namespace) -> tuple[EngineConfig, str]:
    """``--config`` (with ``--model`` replacing model.path) or ``--model``, then ``--set``."""
    if args.config:
        data = read_config(args.config, args.overrides)
        if args.model:
            data.setdefault("model", {})["path"] = args.model
        return build_config(data, str(args.config)), str(args.config)
    return build_config(apply_overrides({"model": {"path": args.model}}, args.overrides), "--model/--set"), \
        "--model/--set"


def batch_command(args: argparse.Namespace) -> int:
    try:
        config, source = engine_config(args)
        plan = job.plan(args.input, args.output)
    except (ConfigError, ValueError, OSError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.ray:
        run: job.Source = RayJob(config, source, args.replicas, args.cpus_per_replica, args.ray_batch_size).run
    else:
        def run(lines: list[InputLine]) -> Iterator[tuple[int, Record]]:
            import torch  # here only: a --ray driver runs no engine (its start skips ~3 s of imports)

            from speculant.engine.llm_engine import LLMEngine

            if args.threads is not None:
                torch.set_num_threads(args.threads)
            return BatchRunner(LLMEngine(config, source=source)).run(lines)
    try:
        summary = job.write(plan, args.output, run, progress=not args.no_progress)
    except (ConfigError, ValueError, OSError, TypeError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"written": summary.num_written, "errors": summary.num_errors,
                      "skipped": summary.num_skipped, "seconds": round(summary.seconds, 3)}))
    return 0
