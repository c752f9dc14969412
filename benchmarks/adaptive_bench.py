"""Adaptive vs fixed draft length with 32 concurrent requests (issue 16, item 4).

SmolLM2-135M-Instruct (``--dtype``, float32 by default), greedy: 32 chat requests submitted together
(the 20 ``unittest`` tasks and 12 ``edit`` tasks of ``repeated_tasks.py``),
for each config: no speculation; ``ngram`` and ``suffix`` with a fixed k; the
same with ``speculative.draft_length = {policy = "adaptive"}`` (the policy's
default cost model, or ``--token-cost``). A fresh engine per run, configs
alternating within each repeat; the figure is the median of output tokens /
wall time. Every config's tokens must equal no speculation's (checked).

Wall time on a shared machine mostly measures the other tenants (this
process runs niced), so each run also records its own CPU time (one torch
thread: CPU seconds are the work done) and ``tok_per_cpu_s``, the figure the
comparison rests on. Each run also records the tokens
scheduled in every step (with speculation: the k budgets, an upper bound on
the proposals actually scored), and ``model_s`` prices them with the
forward-cost fit of ``results/verify_cost.json`` (sum over steps of a + b *
tokens): a rough quiet-machine estimate of the step structure's cost.

    nice -n 10 python benchmarks/adaptive_bench.py --repeats 2
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import harness
from repeated_tasks import conversations


def configs(k: int, token_cost: float | None, eagle: str | None = None,
            confidence: float = 0.4) -> dict[str, dict]:
    adaptive = {"policy": "adaptive", **({"token_cost": token_cost} if token_cost is not None else {})}
    ngram = {"proposer": "ngram", "proposer_options": {"min_n": 2, "max_n": 4}}
    suffix = {"proposer": "suffix"}
    found = {
        "none": {},
        f"ngram_fixed_k{k}": {**ngram, "draft_length": {"policy": "fixed"}},
        "ngram_adaptive": {**ngram, "draft_length": adaptive},
        f"suffix_fixed_k{k}": {**suffix, "draft_length": {"policy": "fixed"}},
        "suffix_adaptive": {**suffix, "draft_length": adaptive},
    }
    if eagle:  # the trained head, alone and behind suffix decoding (the bs = 1 winners)
        head = {"path": eagle, "confidence_threshold": confidence}
        found["eagle_adaptive"] = {"proposer": "eagle", "proposer_options": head, "draft_length": adaptive}
        found["eagle_suffix_adaptive"] = {"proposer": "eagle_suffix", "proposer_options": {"eagle": head},
                                          "draft_length": adaptive}
    return found


def workload() -> list[list[dict[str, str]]]:
    return conversations("unittest") + conversations("edit")[:12]


def run(spec: dict, k: int, max_tokens: int, fit: tuple[float, float] | None, dtype: str = "float32") -> dict:
    from speculant import SamplingParams

    llm = harness.smollm2_llm(spec, k=k, dtype=dtype)
    harness.warm_up(llm)
    llm.engine.reset_metrics()
    step_tokens: list[int] = []
    schedule = llm.engine.scheduler.schedule

    def recorded(*args, **kwargs):
        batch = schedule(*args, **kwargs)
        step_tokens.append(batch.num_tokens)
        return batch

    llm.engine.scheduler.schedule = recorded
    with harness.timed() as t:
        outs = llm.chat(workload(), SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    total = sum(len(t) for t in tokens)
    m = llm.get_metrics()
    model_s = sum(fit[0] + fit[1] * n for n in step_tokens if n) if fit else None
    return {"tok_per_s": total / t.wall, "seconds": t.wall, "output_tokens": total, "token_ids": tokens,
            "cpu_seconds": t.cpu, "tok_per_cpu_s": total / t.cpu,
            "steps": sum(1 for n in step_tokens if n), "step_tokens": step_tokens, "model_s": model_s,
            "model_tok_per_s": total / model_s if model_s else None,
            **{key: m.get(key) for key in ("mean_accepted_length", "acceptance_rate", "num_draft_tokens",
                                           "mean_planned_draft_length", "planned_zero_fraction", "propose_s",
                                           "score_s", "accept_s")}}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "adaptive_concurrent.json", repeats=2,
                           dtype="float32")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--token-cost", type=float, default=None)
    ap.add_argument("--configs", default=None, help="comma-separated subset")
    ap.add_argument("--eagle", default=None, help="a trained EAGLE head (models/smollm2-eagle): adds its configs")
    ap.add_argument("--confidence", type=float, default=0.4, help="the head's confidence_threshold")
    ap.add_argument("--cost", type=Path, default=harness.RESULTS_DIR / "verify_cost.json",
                    help="verify_cost.py's result for this dtype: the step-cost fit and default token_cost")
    args = ap.parse_args()
    cost = args.cost
    fit = None
    if cost.is_file():  # the measured cost model: prices the steps, and is the policy's token_cost
        c = json.loads(cost.read_text())
        fit = (c["fit_fixed_s"], c["fit_per_token_s"])
        if args.token_cost is None:
            args.token_cost = round(c["token_cost"], 4)
    cfgs = configs(args.k, args.token_cost, args.eagle, args.confidence)
    names = args.configs.split(",") if args.configs else list(cfgs)
    bench = harness.start("adaptive_concurrent", args)
    runs = harness.rounds(
        names, args.repeats, lambda name: run(cfgs[name], args.k, args.max_tokens, fit, args.dtype),
        lambda res: f"{res['tok_per_s']:6.2f} tok/s  {res['tok_per_cpu_s']:6.2f} tok/cpu-s  steps {res['steps']}  "
                    f"accepted/step {res['mean_accepted_length'] or 0:.2f}  "
                    f"planned k {res['mean_planned_draft_length'] or 0:.2f}")
    reference = runs[names[0]][0]["token_ids"]
    summary = {}
    for name, rs in runs.items():
        summary[name] = {
            "median_tok_per_s": statistics.median(x["tok_per_s"] for x in rs),
            "median_tok_per_cpu_s": statistics.median(x["tok_per_cpu_s"] for x in rs),
            "tok_per_s": [x["tok_per_s"] for x in rs],
            "steps": rs[0]["steps"],
            "model_tok_per_s": rs[0]["model_tok_per_s"],
            "mean_accepted_length": rs[0]["mean_accepted_length"],
            "acceptance_rate": rs[0]["acceptance_rate"],
            "mean_planned_draft_length": rs[0]["mean_planned_draft_length"],
            "engine_split_s": {key: statistics.median(x[key] for x in rs)
                               for key in ("propose_s", "score_s", "accept_s")},
            "identical_to_first_config": all(x["token_ids"] == reference for x in rs),
        }
    if "none" in summary:
        for s in summary.values():
            s["speedup_vs_none"] = s["median_tok_per_s"] / summary["none"]["median_tok_per_s"]
            s["cpu_speedup_vs_none"] = s["median_tok_per_cpu_s"] / summary["none"]["median_tok_per_cpu_s"]
            if s["model_tok_per_s"] and summary["none"]["model_tok_per_s"]:
                s["model_speedup_vs_none"] = s["model_tok_per_s"] / summary["none"]["model_tok_per_s"]
    bench.write({
        "label": f"{bench.env['cpu']}, {bench.env['date_utc'][:10]}", "model": f"SmolLM2-135M-Instruct ({args.dtype})",
        "workload": "32 chat requests at once (20 unittest + 12 edit tasks, benchmarks/repeated_tasks.py), greedy",
        "k": args.k, "max_tokens": args.max_tokens, "token_cost": args.token_cost, "cost_fit": fit,
        "repeats": args.repeats, "summary": summary,
        "runs": {n: [{k: v for k, v in x.items() if k != "token_ids"} for x in rs] for n, rs in runs.items()}})
    for name, s in summary.items():
        print(f"{name:18s} {s['median_tok_per_s']:6.2f} tok/s  x{s.get('speedup_vs_none', 0):.2f}  cpu "
              f"x{s.get('cpu_speedup_vs_none', 0):.2f} (model "
              f"x{s.get('model_speedup_vs_none', 0):.2f})  identical {s['identical_to_first_config']}")


if __name__ == "__main__":
    main()
