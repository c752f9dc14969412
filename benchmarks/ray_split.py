"""Ray's cost split in two: the fixed start, and the engine's steps, each job run as from a shell.

``ray_scaling.py`` measures what a user waits for (the wall time of a whole
``speculant batch`` command); on a shared 2-core machine its round-by-round
ratios scatter by more than Ray costs. This benchmark says where the cost
comes from. It runs the ``ray_scaling.py`` job (``--max-tokens`` 96 by
default: short jobs give more pairs in the same time) locally and with
``--ray --replicas 1 --cpus-per-replica T`` in alternating rounds, each as
its own process started through this script (``--child``), which times the
engine's steps (``ray_breakdown.traced_steps``: locally in the process, on
Ray inside the actor, ``ray_breakdown.TracedPredictor``) and reports, from
the command's start:

* ``engine_ready_s``: the engine built (on Ray: the actor's worker process
  started, Ray Data's and our imports in it, then torch, transformers and the
  engine load, as locally);
* ``engine_phase_s``: first engine step's start to the last one's end;
* ``after_s``: last step to the command's exit (records returned, written);
* ``steps``: engine steps (the same for both: the actor's engine is kept
  as full as the local one).

Each round pairs the Ray run with the local run beside it:
``fixed_extra_s`` (the difference in ``engine_ready_s`` plus ``after_s``)
and ``engine_phase_pct`` (the ratio of the engine phases). Wrapping the
command in this script imports a little earlier than the bare command
does (the tracing code), the same in both modes.
Result: ``benchmarks/results/ray_split.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import harness
from harness import REPO_ROOT

CHILD = "--child"


def child(trace_dir: str, cli_args: list[str]) -> int:
    """Run ``speculant <cli_args>`` in this process with the engine's steps traced; print one ``TRACE`` line."""
    t0 = time.time()
    import ray_breakdown as rb

    steps: list = []
    threads: list = []
    built: list[float] = []
    if "--ray" in cli_args:
        import ray.cloudpickle

        from speculant.batch import ray_job

        rb.TracedPredictor.trace_dir = trace_dir
        ray_job.Predictor = rb.TracedPredictor
        ray.cloudpickle.register_pickle_by_value(rb)  # the actor cannot import benchmarks/
    else:
        from speculant.engine import llm_engine

        engine_cls = llm_engine.LLMEngine

        def traced_engine(*a, **k):
            engine = engine_cls(*a, **k)
            built.append(time.time())
            rb.traced_steps(engine, steps, threads)
            return engine

        llm_engine.LLMEngine = traced_engine
    from speculant.cli import main

    code = main(cli_args)
    t_end = time.time()
    if not steps:
        trace = next(json.loads(f.read_text()) for f in Path(trace_dir).glob("*.json"))
        built, steps = [trace["init_done"]], trace["steps"]
    print("TRACE " + json.dumps({"engine_ready_s": round(built[0] - t0, 2),
                                 "engine_phase_s": round(steps[-1][1] - steps[0][0], 2),
                                 "after_s": round(t_end - steps[-1][1], 2), "steps": len(steps)}), flush=True)
    return code


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "ray_split.json", repeats=8, threads=2,
                            quick="20 prompts, 8 tokens")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens = 20, 8
    bench = harness.start("ray_split", args)
    import ray
    from ray_scaling import KV_GB, prompts, start_cluster, write_input

    t = args.threads
    tmp, _ = start_cluster(t, "ray-split")
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    modes = {"local": ["--threads", str(t)], f"ray_1x{t}": ["--ray", "--replicas", "1", "--cpus-per-replica", str(t)]}

    def run(name: str, src: Path) -> dict:
        trace_dir = tmp / f"trace-{time.monotonic_ns()}"
        trace_dir.mkdir()
        out = tmp / f"{name}-{src.stem}.jsonl"
        out.unlink(missing_ok=True)
        cli = ["batch", str(src), "--output", str(out), "--config", str(REPO_ROOT / "examples" / "demo.toml"),
               "--set", f"cache.memory_gb={KV_GB}", "--no-progress", *modes[name]]
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, CHILD, str(trace_dir), *cli], env=env,
                              capture_output=True, text=True, cwd=REPO_ROOT)
        wall = time.perf_counter() - start
        assert done.returncode == 0, f"{name} exited {done.returncode}: {done.stderr[-2000:]}"
        trace = next(line for line in done.stdout.splitlines() if line.startswith("TRACE "))
        return {"wall_s": round(wall, 2), **json.loads(trace.removeprefix("TRACE "))}

    warm = tmp / "warm.jsonl"  # outside the rounds: the kernels' first build, the cluster's Ray Data actors
    write_input(warm, prompts(4), 4)
    for name in modes:
        run(name, warm)
    src = tmp / "job.jsonl"
    write_input(src, prompts(args.prompts), args.max_tokens)

    def run_one(name: str) -> dict:
        row = run(name, src)
        bench.log(f"{name}: {row}")
        return row

    runs = harness.rounds(list(modes), args.repeats, run_one)
    ray_name = f"ray_1x{t}"
    pairs = [{"fixed_extra_s": round(r["engine_ready_s"] + r["after_s"] - loc["engine_ready_s"] - loc["after_s"], 2),
              "engine_phase_pct": round(100 * (r["engine_phase_s"] / loc["engine_phase_s"] - 1), 1),
              "wall_pct": round(100 * (r["wall_s"] / loc["wall_s"] - 1), 1)}
             for r, loc in zip(runs[ray_name], runs["local"])]
    identical = (tmp / f"{ray_name}-job.jsonl").read_text() == (tmp / "local-job.jsonl").read_text()
    summary = {"prompts": args.prompts, "max_tokens": args.max_tokens, "total_threads": t,
               "median": {name: {k: round(harness.median([r[k] for r in rows]), 2) for k in rows[0]}
                          for name, rows in runs.items()},
               "paired_median": {k: round(harness.median([p[k] for p in pairs]), 2) for k in pairs[0]},
               "pairs": pairs, "outputs_identical": identical}
    bench.log(f"summary: {summary}")
    ray.shutdown()
    bench.write({"summary": summary, "runs": runs})


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == CHILD:
        sys.exit(child(sys.argv[2], sys.argv[3:]))
    main()
