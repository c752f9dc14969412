"""Where ``speculant batch --ray``'s extra time goes: the same job locally and on Ray, traced.

The job of ``ray_scaling.py`` (its prompts, ``examples/demo.toml``, greedy,
``--max-tokens``), run once locally and once per Ray mode, with the engine's
steps timed in every run: locally in this process; on Ray inside each actor
(a subclass of ``Predictor``, sent to the workers by value, that writes its
trace to a file). For each run it reports:

* ``load_s``: job start to the engine built (on Ray, per actor: job start to
  its constructor running, ``to_actor_init_s``: Ray Data's start and the
  actor's scheduling; then ``engine_load_s``: the actor's imports of torch
  and transformers and its engine load);
* ``torch_threads``: torch's threads in the thread that steps the engine;
* ``steps``, ``step_s`` (the sum of engine step times), ``mean_running``
  (requests running per step) and ``tail_steps`` (steps with fewer than half
  of ``max_num_seqs`` running: an engine that is not kept fed);
* ``idle_s``: time an actor's engine had no work between its engine built and
  its last batch returned (batch boundaries);
* ``after_s``: last record computed to the job's end (return and write);
* ``cpu_s``: CPU seconds of each kind of process during the job (this one,
  Ray's ``raylet``/``gcs_server``, the actors, anything else on the machine).

Result: ``benchmarks/results/ray_breakdown.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
from ray_scaling import KV_GB, batch, prompts, start_cluster, write_input

import harness
from speculant.batch import ray_job
from speculant.batch.ray_job import Predictor


def traced_steps(engine, steps: list, steps_threads: list) -> None:
    """Time ``engine.step`` calls into ``steps``: (start, end, running, waiting) each; note torch's threads
    in the stepping thread in ``steps_threads``."""
    step = engine.step

    def timed():
        if not steps:  # the threads torch uses in the stepping thread (an actor steps in its own thread)
            import torch

            steps_threads.append(torch.get_num_threads())
        occ = engine.occupancy()
        t = time.time()
        out = step()
        steps.append((t, time.time(), occ["num_running"], occ["num_waiting"]))
        return out

    engine.step = timed


class TracedPredictor(Predictor):
    trace_dir = ""  # set in the driver before the job: sent with the class

    def __init__(self, *args, **kwargs) -> None:
        self.trace = {"pid": os.getpid(), "init_enter": time.time(), "calls": [], "steps": [], "threads": [],
                      "process_start": psutil.Process().create_time()}
        super().__init__(*args, **kwargs)
        self.trace["init_done"] = time.time()
        traced_steps(self.engine, self.trace["steps"], self.trace["threads"])

    @property
    def engine(self):
        return self.runner.engine if hasattr(self, "runner") else self.loop.engine

    def __call__(self, batch):
        t = time.time()
        out = super().__call__(batch)
        self.trace["calls"].append((t, time.time(), len(batch["number"])))
        Path(self.trace_dir, f"{self.trace['pid']}.json").write_text(json.dumps(self.trace))
        return out


def cpu_by_kind(actor_pids: set[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
        t = p.info["cpu_times"]
        if t is None:
            continue
        name = p.info["name"] or ""
        cmd = " ".join(p.info["cmdline"] or [])
        kind = ("driver" if p.info["pid"] == os.getpid() else "actor" if p.info["pid"] in actor_pids
                else "raylet" if "raylet" in name else "gcs_server" if "gcs_server" in name
                else "ray_other" if "ray" in cmd else "other")
        key = f"{kind}:{p.info['pid']}"
        out[key] = t.user + t.system
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for key, v in after.items():
        kind = key.split(":")[0]
        sums[kind] = sums.get(kind, 0.0) + v - before.get(key, 0.0)
    return {k: round(v, 1) for k, v in sorted(sums.items())}


def step_stats(steps: list, max_num_seqs: int) -> dict:
    n = len(steps)
    ms = [1000 * (e - s) for s, e, _, _ in steps]
    return {"steps": n, "step_s": round(sum(e - s for s, e, _, _ in steps), 1),
            "step_ms_p10_p50_p90_p99": [round(harness.percentile(ms, q), 1) for q in (10, 50, 90, 99)] if n else [],
            "mean_step_ms": round(1000 * sum(e - s for s, e, _, _ in steps) / max(n, 1), 1),
            "mean_running": round(sum(r for _, _, r, _ in steps) / max(n, 1), 1),
            "tail_steps": sum(r < max_num_seqs / 2 for _, _, r, _ in steps)}


def actor_report(trace: dict, t0: float, t_end: float, max_num_seqs: int) -> dict:
    calls = trace["calls"]
    span = (calls[-1][1] if calls else trace["init_done"]) - trace["init_done"]
    return {"to_actor_process_s": round(trace["process_start"] - t0, 1),
            "to_actor_init_s": round(trace["init_enter"] - t0, 1),
            "engine_load_s": round(trace["init_done"] - trace["init_enter"], 1),
            "batches": [n for _, _, n in calls], "work_span_s": round(span, 1), "torch_threads": trace["threads"],
            "idle_s": round(span - sum(e - s for s, e, _, _ in trace["steps"]), 1),
            "after_s": round(t_end - (calls[-1][1] if calls else t_end), 1),
            **step_stats(trace["steps"], max_num_seqs)}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "ray_breakdown.json", threads=2,
                            quick="20 prompts, 8 tokens")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--modes", nargs="+", default=["local", "ray_1xT", "ray_Tx1"])
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens = 20, 8
    bench = harness.start("ray_breakdown", args)
    import ray

    from speculant.engine import llm_engine

    t = args.threads
    tmp, cluster_s = start_cluster(t, "ray-breakdown")
    modes = {"local": ["--threads", str(t)],
             "ray_1xT": ["--ray", "--replicas", "1", "--cpus-per-replica", str(t)],
             "ray_Tx1": ["--ray", "--replicas", str(t), "--cpus-per-replica", "1"]}
    local_steps: list = []
    local_threads: list = []
    built: list[float] = []
    engine_cls = llm_engine.LLMEngine

    def local_engine(*a, **k):
        engine = engine_cls(*a, **k)
        built.append(time.time())
        traced_steps(engine, local_steps, local_threads)
        return engine

    llm_engine.LLMEngine = local_engine  # the local job imports it when it runs
    TracedPredictor.trace_dir = str(tmp / "traces")
    ray_job.Predictor = TracedPredictor
    warm = tmp / "warm.jsonl"
    write_input(warm, prompts(4), 4)
    batch(warm, tmp / "warm-out.jsonl", modes["local"])
    src = tmp / "in.jsonl"
    write_input(src, prompts(args.prompts), args.max_tokens)
    max_num_seqs = 32  # examples/demo.toml
    report, outputs = {}, {}
    for name in args.modes:
        local_steps.clear()
        local_threads.clear()
        built.clear()
        trace_dir = Path(TracedPredictor.trace_dir)
        trace_dir.mkdir(exist_ok=True)
        for f in trace_dir.glob("*.json"):
            f.unlink()
        before = cpu_by_kind(set())
        t0 = time.time()
        summary = batch(src, tmp / f"{name}.jsonl", modes[name])
        t_end = time.time()
        traces = [json.loads(f.read_text()) for f in trace_dir.glob("*.json")]
        cpu = cpu_delta(before, cpu_by_kind({tr["pid"] for tr in traces}))
        outputs[name] = (tmp / f"{name}.jsonl").read_text()
        row = {"wall_s": summary["wall_s"], "cpu_s": cpu}
        if name == "local":
            last = local_steps[-1][1]
            row.update(load_s=round(built[0] - t0, 1), after_s=round(t_end - last, 1), torch_threads=local_threads[:1],
                       **step_stats(local_steps, max_num_seqs))
        else:
            row["actors"] = [actor_report(tr, t0, t_end, max_num_seqs) for tr in traces]
        row["identical_to_local"] = outputs[name] == outputs.get("local", outputs[name])
        bench.log(f"{name}: {json.dumps(row)}")
        report[name] = row
    ray.shutdown()
    bench.write({"summary": {"prompts": args.prompts, "max_tokens": args.max_tokens, "total_threads": t,
                             "cluster_start_s": round(cluster_s, 1), "kv_gb": KV_GB, "modes": report}})


if __name__ == "__main__":
    main()
