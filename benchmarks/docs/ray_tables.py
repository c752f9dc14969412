"""The docs table of ``benchmarks/ray_scaling.py``: ``speculant batch`` locally and on Ray, and Ray Serve."""

from __future__ import annotations

import json
from pathlib import Path

from .tables import markdown_table, measured_on


def _label(name: str, threads: int) -> str:
    if name == "local":
        return f"local, one engine, {threads} thread{'s' if threads > 1 else ''}"
    replicas, cpus = name.removeprefix("ray_").split("x")
    return f"`--ray --replicas {replicas} --cpus-per-replica {cpus}`"


def _paired(job: dict, name: str) -> str:
    by_round = job.get("ray_overhead_pct_by_round", {}).get(name)
    if name == "local" or not by_round:
        return "–"
    rounds = ", ".join(f"{v:+.1f}" for v in by_round)
    return f"{rounds} % ({job['ray_overhead_pct_paired_median'][name]:+.1f} %)"


def _result(results: Path, name: str) -> tuple[dict, dict, str] | None:
    """A result file's data, its summary and the load average at its start; None if it is not there."""
    path = results / name
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data, data["summary"], str((data.get("environment", {}).get("load_avg") or ["?"])[0])


def ray_scaling(results: Path) -> list[str]:
    """`speculant batch` on one engine and on Ray Data at the same total threads; Ray Serve with 2 replicas"""
    found = _result(results, "ray_scaling.json")
    if found is None:
        return []
    data, s, load = found
    rows = []
    for job in s["jobs"]:
        for name, wall in job["job_wall_s"].items():
            cost = "–" if name == "local" else \
                f"{job['ray_overhead_s'][name]:+.1f} s ({job['ray_overhead_pct_of_local'][name]:+.1f} %)"
            same = "yes" if job["outputs_identical_to_local"][name] else "**no**"
            rows.append([job["max_tokens"], _label(name, s["total_threads"]), f"{wall:.1f} s", cost,
                         _paired(job, name), same])
    out = markdown_table(
        f"`ray_scaling.json`: {s['prompts']} prompts, greedy, the demo pair (`examples/demo.toml`), "
        f"{s['total_threads']} torch thread(s) in all, each job run as {s.get('jobs_run_as', 'this process')}, "
        f"engine loading included, median of "
        f"{data['options'].get('repeats', 1)} alternating rounds; measured on {measured_on(data)}, a shared "
        f"machine (load average {load} at the start).",
        ["tokens per prompt", "run", "job wall time", "Ray's cost (medians)",
         "Ray's cost round by round (against the local run beside it; median)", "records identical to local"], rows)
    v = s["serve"]
    first = s.get("first_ray_job_s")
    lines = s.get("first_ray_job_lines", 4)  # results written before the count was recorded ran 4 lines
    first_job = "" if first is None else (
        f"Its first Ray job ({lines} lines, outside the rounds) took {first:.1f} s: it also starts the cluster's own "
        "Ray Data actors, which later jobs reuse. ")
    out += ["", f"The local Ray cluster started once, in {s['cluster_start_s']:.1f} s (not in the job times). "
            f"{first_job}Ray Serve, {v['replicas']} replicas at {v['cpus_per_replica']} CPU: {v['streams']} concurrent "
            f"streams, {v['completed']} completed, {v['failed']} failed, {v['distinct_response_ids']} distinct "
            f"response ids, every text equal to `LLM.generate`: {'yes' if v['all_equal_llm_generate'] else 'no'} "
            f"({v['streams_wall_s']:.1f} s for all; deploying took {v['deploy_s']:.0f} s)."]
    return out


def _step_ms(row: dict) -> str:
    """Mean step time, with its p10 / p50 / p90 where the run recorded them."""
    pct = row.get("step_ms_p10_p50_p90_p99")
    return f"{row['mean_step_ms']} ({' / '.join(str(v) for v in pct[:3])})" if pct else str(row["mean_step_ms"])


def ray_breakdown(results: Path) -> list[str]:
    """Where `speculant batch --ray`'s extra time goes: the same job traced locally and in each actor"""
    found = _result(results, "ray_breakdown.json")
    if found is None:
        return []
    data, s, load = found
    t = s["total_threads"]
    return markdown_table(
        f"`ray_breakdown.json`: the `ray_scaling.py` job ({s['prompts']} prompts, {s['max_tokens']} tokens each) "
        f"once per run, engine steps timed in the driver or in each actor; measured on {measured_on(data)} "
        f"(load average {load} at the start).",
        ["run", "wall", "start to engine ready (Ray: actor up + its imports and engine load)", "engine steps",
         "ms per step: mean (p10 / p50 / p90)", "requests running per step", "steps with < 16 running",
         "engine idle", "CPU of the driver and Ray's processes"],
        (_breakdown_cells(name, row, t) for name, row in s["modes"].items()))


def _breakdown_cells(name: str, row: dict, t: int) -> list[object]:
    label = _label(name.replace("T", str(t)), t)
    if name == "local":
        return [label, f"{row['wall_s']:.1f} s", f"{row['load_s']:.1f} s", row["steps"], _step_ms(row),
                row["mean_running"], row["tail_steps"], "–", "–"]
    actors = row["actors"]
    ray_cpu = sum(v for k, v in row["cpu_s"].items() if k in ("driver", "raylet", "gcs_server", "ray_other"))
    return [label, f"{row['wall_s']:.1f} s",
            ", ".join(f"{a['to_actor_init_s']:.1f} + {a['engine_load_s']:.1f} s" for a in actors),
            " + ".join(str(a["steps"]) for a in actors), " / ".join(_step_ms(a) for a in actors),
            " / ".join(str(a["mean_running"]) for a in actors), " + ".join(str(a["tail_steps"]) for a in actors),
            " / ".join(f"{a['idle_s']:.1f} s" for a in actors), f"{ray_cpu:.1f} s"]


def _signed(values: list[float], unit: str) -> str:
    return ", ".join(f"{v:+.1f}" for v in values) + f" {unit}"


def ray_split(results: Path) -> list[str]:
    """Ray's cost split into its fixed start and its engine phase, each job as its own process"""
    found = _result(results, "ray_split.json")
    if found is None:
        return []
    data, s, load = found
    t = s["total_threads"]
    out = markdown_table(
        f"`ray_split.json`: the `ray_scaling.py` job ({s['prompts']} prompts, {s['max_tokens']} tokens each), "
        f"each run as its own process (as from a shell) with the engine's steps timed, "
        f"{data['options'].get('repeats', 1)} alternating rounds (medians); measured on {measured_on(data)} "
        f"(load average {load} at the start).",
        ["run", "wall", "command start to engine ready", "engine phase (first step to last)", "last step to exit",
         "engine steps"],
        ([_label(name, t), f"{row['wall_s']:.1f} s", f"{row['engine_ready_s']:.1f} s",
          f"{row['engine_phase_s']:.1f} s", f"{row['after_s']:.1f} s", f"{row['steps']:.0f}"]
         for name, row in s["median"].items()))
    pairs, med = s["pairs"], s["paired_median"]
    out += ["", "Round by round, the Ray run against the local run beside it (median in brackets): fixed extra "
            f"(engine ready later, plus the end) {_signed([p['fixed_extra_s'] for p in pairs], 's')} "
            f"({med['fixed_extra_s']:+.1f} s); engine phase {_signed([p['engine_phase_pct'] for p in pairs], '%')} "
            f"({med['engine_phase_pct']:+.1f} %); whole command {_signed([p['wall_pct'] for p in pairs], '%')} "
            f"({med['wall_pct']:+.1f} %). Records identical to local: "
            f"{'yes' if s['outputs_identical'] else '**no**'}."]
    return out
