"""``speculant batch INPUT.jsonl --output OUT.jsonl``: a file of prompts to a file of answers.

Each input line is ``{"id", "prompt"}`` or ``{"id", "messages"}`` with
optional sampling fields under OpenAI's names (``speculant.batch.lines``);
each gets one output record, in input order (``speculant.batch.output``). A
rerun of the same command skips the ids already answered. Runs on one local
engine, or with ``--ray`` on a pool of engines over Ray Data
(``speculant.batch.ray_job``; a cluster from ``RAY_ADDRESS``, else a local one).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch", help="run a JSONL file of prompts, writing a JSONL file of answers",
                       description="Run every line of INPUT (JSON objects: id, prompt or messages, sampling "
                                   "fields) and write one record per line to --output, in input order. "
                                   "A rerun skips the ids already in the output.")
    p.add_argument("input", metavar="INPUT.jsonl")
    p.add_argument("--output", required=True, metavar="OUT.jsonl", help="where records go (appended on a rerun)")
    p.add_argument("--config", help="engine config file (.toml, .yaml)")
    p.add_argument("--model", help="local Hugging Face model directory or .gguf file (overrides model.path)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value, e.g. --set speculative.num_speculative_tokens=3")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads of the local engine (default: torch's choice, one per core)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    ray = p.add_argument_group("Ray", "run the job over Ray Data, one engine per actor (needs speculant[ray])")
    ray.add_argument("--ray", action="store_true",
                     help="run on Ray: the cluster at $RAY_ADDRESS, or else a local one on this machine")
    ray.add_argument("--replicas", type=int, default=1, help="engines (Ray actors) side by side (default: 1)")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0,
                     help="CPUs Ray reserves for each engine; its torch threads are this rounded up (default: 1)")
    ray.add_argument("--ray-batch-size", type=int, default=None,
                     help="lines Ray hands an actor per call; an actor holds several at once and its engine runs "
                          "them all together, so this sets how evenly a job spreads over the actors (a killed "
                          "actor's batches are redone whole; default: scheduler.max_num_seqs / 2)")
    p.set_defaults(func=run)


def _usage_problem(args: argparse.Namespace) -> str | None:
    if not args.config and not args.model:
        return "pass --config FILE (TOML/YAML) or --model DIR|FILE.gguf"
    if args.threads is not None and args.threads < 1:
        return f"--threads {args.threads}: need at least 1 thread; omit it for torch's choice"
    if not args.ray:
        used = [o for o, v, d in (("--replicas", args.replicas, 1), ("--cpus-per-replica", args.cpus_per_replica, 1.0),
                                  ("--ray-batch-size", args.ray_batch_size, None)) if v != d]
        return f"{', '.join(used)} only apply with --ray; add --ray or drop them" if used else None
    if importlib.util.find_spec("ray") is None:
        return "--ray needs Ray: pip install 'speculant[ray]'"
    if args.replicas < 1:
        return f"--replicas {args.replicas}: need at least 1 engine"
    if not args.cpus_per_replica > 0:
        return f"--cpus-per-replica {args.cpus_per_replica}: must be > 0 (fractions such as 0.5 are allowed)"
    if args.ray_batch_size is not None and args.ray_batch_size < 1:
        return f"--ray-batch-size {args.ray_batch_size}: must be at least 1 line"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _usage_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from speculant.batch.command import batch_command

    return batch_command(args)
