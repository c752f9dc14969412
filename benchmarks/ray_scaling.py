"""Ray scaling: ``speculant batch`` locally and on Ray Data at the same total threads, and Ray Serve.

The job: ``--prompts`` (200) Python function heads for the demo pair
(``examples/demo.toml``: ``models/demo-target`` verified with the
``models/demo-draft`` draft), greedy, ``--max-tokens`` each (one job per
value: 48 and 384; Ray's start-up is a fixed cost, which a longer job dilutes). Each job runs as
its own ``python -m speculant.cli batch`` process, as a user runs it from a shell, so its time counts
the imports and the engine loading in every mode (``--in-process`` runs them inside this process
instead, where torch and transformers are already imported and the local job starts ~3 s sooner):

* ``local``: ``speculant batch --threads T``, one engine on T threads;
* ``ray_1xT``: ``--ray --replicas 1 --cpus-per-replica T``: the same engine in
  one Ray Data actor, so the difference to ``local`` is what Ray costs;
* ``ray_Tx1`` (T > 1): ``--ray --replicas T --cpus-per-replica 1``: T engines
  of one thread each (same total threads).

The default is T = 1: on a shared 2-core machine two torch threads per engine
ran several times slower than one (2026-12-05, load average ~9: the threads
wait on each other), which would measure the machine, not Ray.

The local Ray cluster (``num_cpus=T``, no dashboard) is started once, timed
apart (a long-lived cluster pays it once). Two warm-up jobs run first, outside
the rounds: a local one (one-time set-up: the C kernels' first build) and a Ray
one (``first_ray_job_s``: Ray Data's first job on a cluster also starts the
cluster's own Ray Data actors, ~1.4 s of CPU each, which later jobs reuse).
Rounds (``--repeats``) alternate the order (``ray_1xT`` always runs right
beside the local run of its round; ``ray_Tx1`` one run further away), and each
round gives its own Ray/local ratio (``ray_overhead_pct_by_round``, their
median ``ray_overhead_pct_paired_median``): on a shared machine the speed
drifts between rounds by more than Ray costs, and neighbours share the drift.
Every output must equal the local one byte for byte. Then Ray Serve: 2
replicas, ``--streams`` (64) concurrent streaming requests over loopback, each
text compared with ``LLM.generate``; none may be lost or duplicated.
Result: ``benchmarks/results/ray_scaling.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import REPO_ROOT

VERBS = ["parse", "format", "load", "save", "check", "build", "merge", "split", "render", "update"]
NOUNS = ["header", "config", "path", "record", "token", "buffer", "message", "table", "entry", "stream"]
ARGS = ["self", "self, value", "data", "path, mode='r'"]
KV_GB = 0.25  # KV pool per engine: ample for 32 running requests of < 450 tokens, and light on a shared machine


def prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        v, o, a = VERBS[i % 10], NOUNS[(i // 10) % 10], ARGS[(i // 100) % 4]
        out.append(f"def {v}_{o}({a}):\n" if i % 2 == 0 else f"class {o.title()}{v.title()}er:\n    def __init__({a}):")
    return out


def write_input(path: Path, ps: list[str], max_tokens: int) -> None:
    path.write_text("".join(json.dumps({"id": i, "prompt": p, "max_tokens": max_tokens, "temperature": 0,
                                        "ignore_eos": True}) + "\n" for i, p in enumerate(ps)))


def batch(src: Path, out: Path, extra: list[str], ray_address: str | None = None) -> dict:
    """One ``speculant batch`` run, its summary and wall seconds: as its own process, the way a
    user runs it from a shell (``--ray`` joining the running cluster through ``RAY_ADDRESS``), or,
    with ``ray_address`` None, in this process (torch and transformers already imported)."""
    args = ["batch", str(src), "--output", str(out), "--config", str(REPO_ROOT / "examples" / "demo.toml"),
            "--set", f"cache.memory_gb={KV_GB}", "--no-progress", *extra]
    out.unlink(missing_ok=True)
    start = time.perf_counter()
    if ray_address is not None:
        env = {**os.environ, "RAY_ADDRESS": ray_address}
        done = subprocess.run([sys.executable, "-m", "speculant.cli", *args], env=env, capture_output=True,
                              text=True, cwd=REPO_ROOT)
        wall = time.perf_counter() - start
        assert done.returncode == 0, f"speculant batch {extra} exited {done.returncode}: {done.stderr[-2000:]}"
        text = done.stdout
    else:
        from speculant.cli import main

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(args)
        wall = time.perf_counter() - start
        assert code == 0, f"speculant batch {extra} exited {code}"
        text = buf.getvalue()
    return {**json.loads(text.strip().splitlines()[-1]), "wall_s": round(wall, 2)}


def start_cluster(threads: int, name: str) -> tuple[Path, float]:
    """Start this benchmark's local Ray cluster (``threads`` CPUs, no dashboard, no usage stats, and Ray's
    OOM monitor off: on a shared machine other jobs' memory must not make it kill this run's workers),
    with the repository as the working folder; return a scratch folder and the cluster's start seconds."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    import ray

    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    os.chdir(REPO_ROOT)
    start = time.perf_counter()
    ray.init(address="local", num_cpus=threads, include_dashboard=False, log_to_driver=False)
    return tmp, time.perf_counter() - start


def serve_check(num_streams: int, max_tokens: int, ps: list[str], cpus: float) -> dict:
    import openai

    from speculant import LLM, SamplingParams
    from speculant.config.compat import build_config
    from speculant.config.models import read_config
    from speculant.server.ray_serve import ReplicaOptions, deploy, undeploy

    os.chdir(REPO_ROOT)  # demo.toml names its models relative to the repository
    data = read_config(str(REPO_ROOT / "examples" / "demo.toml"), [f"cache.memory_gb={KV_GB}"])
    options = ReplicaOptions("demo")
    start = time.perf_counter()
    url = deploy(build_config(data, "demo.toml"), "demo.toml", options, replicas=2, cpus_per_replica=cpus, port=8765)
    deploy_s = time.perf_counter() - start
    ps = ps[:num_streams]

    async def one(client, p):
        text, ids = "", set()
        stream = await client.completions.create(model="demo", prompt=p, max_tokens=max_tokens, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        async for chunk in stream:
            ids.add(chunk.id)
            text += chunk.choices[0].text
        return ids, text

    async def run():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600) as c:
            return await asyncio.gather(*(one(c, p) for p in ps), return_exceptions=True)

    start = time.perf_counter()
    results = asyncio.run(run())
    streams_s = time.perf_counter() - start
    undeploy(options)
    reference = LLM.from_dict(data, "reference").generate(
        ps, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True), use_tqdm=False)
    ok = [r for r in results if not isinstance(r, BaseException)]
    ids = [i for r in ok for i in r[0]]
    return {"replicas": 2, "cpus_per_replica": cpus, "streams": len(ps), "completed": len(ok),
            "failed": len(results) - len(ok),
            "distinct_response_ids": len(set(ids)), "all_equal_llm_generate": len(ok) == len(ps) and all(
                r[1] == w.outputs[0].text for r, w in zip(ok, reference)),
            "deploy_s": round(deploy_s, 1), "streams_wall_s": round(streams_s, 2)}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "ray_scaling.json", repeats=3, threads=1,
                            quick="20 prompts, 8 tokens, 8 streams")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[48, 384],
                    help="one job per value (Ray's fixed start-up weighs less on a longer job)")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--in-process", action="store_true",
                    help="run every job inside this benchmark's process (torch and transformers already imported: "
                         "the local job's start is then cheaper than a shell's) instead of as its own process")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.streams = 20, [8], 8
    bench = harness.start("ray_scaling", args)
    import ray

    t = args.threads
    tmp, cluster_s = start_cluster(t, "ray-scaling")
    ps = prompts(args.prompts)
    bench.log(f"local Ray cluster up in {cluster_s:.1f} s")
    address = None if args.in_process else ray.get_runtime_context().gcs_address
    modes = {"local": ["--threads", str(t)],
             f"ray_1x{t}": ["--ray", "--replicas", "1", "--cpus-per-replica", str(t)]}
    if t > 1:
        modes[f"ray_{t}x1"] = ["--ray", "--replicas", str(t), "--cpus-per-replica", "1"]
    warm = tmp / "warm.jsonl"  # outside the rounds: one-time set-up counts in no mode (module docstring)
    warm_lines = ps[:4]
    write_input(warm, warm_lines, 4)
    batch(warm, tmp / "warm-out.jsonl", modes["local"], address)
    first_ray = batch(warm, tmp / "warm-ray.jsonl", modes[f"ray_1x{t}"], address)["wall_s"]
    bench.log(f"first Ray job on the cluster (4 lines, 4 tokens): {first_ray} s")
    jobs, all_runs = [], {}
    for max_tokens in args.max_tokens:
        src = tmp / f"in-{max_tokens}.jsonl"
        write_input(src, ps, max_tokens)

        def run_one(name: str, src: Path = src, max_tokens: int = max_tokens) -> dict:
            summary = batch(src, tmp / f"{name}-{max_tokens}.jsonl", modes[name], address)
            bench.log(f"max_tokens {max_tokens}, {name}: {summary}")
            return summary

        runs = harness.rounds(list(modes), args.repeats, run_one)
        local_out = (tmp / f"local-{max_tokens}.jsonl").read_text()
        wall = {name: harness.median([r["wall_s"] for r in runs[name]]) for name in modes}
        # round by round: the Ray run against the local run next to it (the machine's speed drifts by
        # more than Ray's cost between rounds; neighbours share it)
        paired = {n: [round(100 * (ray["wall_s"] / loc["wall_s"] - 1), 1) for ray, loc in zip(runs[n], runs["local"])]
                  for n in modes if n != "local"}
        job = {"max_tokens": max_tokens, "job_wall_s": wall,
               "ray_overhead_s": {n: round(wall[n] - wall["local"], 1) for n in modes if n != "local"},
               "ray_overhead_pct_of_local": {n: round(100 * (wall[n] / wall["local"] - 1), 1)
                                             for n in modes if n != "local"},
               "ray_overhead_pct_by_round": paired,
               "ray_overhead_pct_paired_median": {n: round(harness.median(v), 1) for n, v in paired.items()},
               "outputs_identical_to_local": {n: (tmp / f"{n}-{max_tokens}.jsonl").read_text() == local_out
                                              for n in modes}}
        bench.log(f"max_tokens {max_tokens}: {job}")
        jobs.append(job)
        all_runs[str(max_tokens)] = runs
    serve = serve_check(args.streams, min(args.max_tokens), ps, t / 2)
    bench.log(f"serve: {serve}")
    ray.shutdown()
    bench.write({"summary": {"prompts": args.prompts, "total_threads": t, "cluster_start_s": round(cluster_s, 1),
                             "first_ray_job_s": first_ray, "first_ray_job_lines": len(warm_lines),
                             "jobs_run_as": "this process" if args.in_process else "one process each (as from a shell)",
                             "jobs": jobs, "serve": serve, "note": "shared machine: other jobs ran alongside"},
                 "runs": all_runs})


if __name__ == "__main__":
    main()
