"""Where a token-tree step's time goes, against a chain step (issue 52).

bs = 1, edit prompts, SmolLM2; rows ``chain_k{K}`` (fixed chains), ``tree_fixed``
(width ``--width``, ``--nodes`` nodes, depth ``--depth``, whole trees) and
``tree_adaptive`` (the same limits, shapes from ``engine/tree_shape.py``), run in
alternating rounds. Each engine stage is timed by wrapping the function the
engine calls (the wrappers add a few microseconds per call); only steps of
decodes alone count (a prefill step's forward is another size). Per row and per
verify step, medians over rounds: the step's wall time split into the policy's
plan, scheduling, the proposer (tree building included), pruning the tree to
its planned shape, the target forward (tree attention included), acceptance,
compacting the accepted path's K/V, commit planning, the proposer's commit, and
the rest (the engine's own Python around them); the forward's rows; and the
forward's seconds against t(rows) from the cost curve (a chain of that many
rows, measured at load).

    /tmp/q/bench python benchmarks/tree_step_profile.py --proposer suffix
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from tree_bench import proposer, spread

import harness
from repeated_tasks import conversations

STAGES = ("plan", "schedule", "propose", "prune", "forward", "accept", "compact", "commit_plan", "proposer_commit")


class StageClock:
    """Seconds per stage of the current step; folded into totals for steps of decodes alone."""

    def __init__(self) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.rows = 0
        self.prefill = False
        self.reset()

    def reset(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.num_steps = 0
        self.sum_rows = 0
        self.forward_by_rows: dict[int, list[float]] = defaultdict(list)

    def wrap(self, owner: Any, attr: str, stage: str, before: Callable[..., None] | None = None) -> None:
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            if before is not None:
                before(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.step[stage] += time.perf_counter() - t0
        setattr(owner, attr, timed)

    def wrap_step(self, owner: Any) -> None:
        fn = owner._step

        def step(engine):
            self.step.clear()
            self.prefill, self.rows = False, 0
            t0 = time.perf_counter()
            out = fn(engine)
            wall = time.perf_counter() - t0
            if not self.prefill and self.rows:
                self.num_steps += 1
                self.sum_rows += self.rows
                self.totals["step"] += wall
                for k, v in self.step.items():
                    self.totals[k] += v
                self.forward_by_rows[self.rows].append(self.step["forward"])
            return out
        owner._step = step

    def saw_forward(self, scorer, runner, batch, proposals, *rest) -> None:
        self.prefill = bool(batch.prefills)
        self.rows = len(batch.decodes) + proposals.num_draft_tokens


def instrument(clock: StageClock) -> None:
    from speculant.engine import draft_length, llm_engine, proposer_guard, scheduler, step_runner, tree_shape

    clock.wrap_step(llm_engine.LLMEngine)
    clock.wrap(draft_length.DraftLengthPolicy, "plan", "plan")
    clock.wrap(scheduler.Scheduler, "schedule", "schedule")
    clock.wrap(step_runner, "propose", "propose")
    clock.wrap(tree_shape.AdaptiveTreeShapes, "prune", "prune")
    clock.wrap(step_runner, "score", "forward", before=clock.saw_forward)
    clock.wrap(step_runner, "decide", "accept")
    clock.wrap(step_runner, "compact_paths", "compact")
    clock.wrap(step_runner, "_planned", "commit_plan")
    clock.wrap(proposer_guard.ProposerGuard, "commit", "proposer_commit")


def configs(args) -> dict[str, dict[str, Any]]:
    p = proposer(args.proposer)
    fixed = {"policy": "fixed"}
    tree = {**p, "num_speculative_tokens": args.depth, "tree_width": args.width, "max_tree_tokens": args.nodes}
    out = {f"chain_k{k}": {**p, "num_speculative_tokens": k, "draft_length": fixed}
           for k in (int(x) for x in args.chain_ks.split(",") if x)}
    out["tree_fixed"] = {**tree, "draft_length": fixed}
    out["tree_adaptive"] = tree
    return out


def run_one(llm, clock: StageClock, convs, params) -> dict[str, Any]:
    llm.engine.reset_metrics()
    clock.reset()
    outs, wall = [], 0.0
    for conv, param in zip(convs, params):  # one request at a time (bs = 1)
        outs += llm.chat([conv], param, use_tqdm=False)
        wall += llm.last_run_seconds
    n = max(1, clock.num_steps)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    m = llm.get_metrics()
    hist = m.get("accepted_length_histogram", [])
    steps = sum(hist)
    stage_ms = {k: 1e3 * clock.totals.get(k, 0.0) / n for k in ("step", *STAGES)}
    stage_ms["rest"] = stage_ms["step"] - sum(stage_ms[k] for k in STAGES)
    return {"tok_per_s": tokens / wall, "ms": stage_ms, "rows": clock.sum_rows / n,
            "tokens_per_step": sum((a + 1) * c for a, c in enumerate(hist)) / steps if steps else 0.0,
            "forward_by_rows": {r: harness.median(v) for r, v in clock.forward_by_rows.items()},
            "cost_curve": m.get("cost_curve"), "verified_nodes": m.get("mean_verified_tree_nodes")}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "tree_step_profile.json", repeats=5,
                            dtype="bfloat16", threads=2)
    ap.add_argument("--proposer", default="suffix")
    ap.add_argument("--chain-ks", default="8,16")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--width", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    bench = harness.start("tree_step_profile", args)
    from speculant import LLM, SamplingParams

    clock = StageClock()
    instrument(clock)
    convs = conversations("edit")[:4]
    params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens) for _ in convs]
    model = {"path": harness.smollm2_path(), "dtype": args.dtype, "quantization": "dequantize"}
    cfgs = configs(args)
    llms = {}
    for name, spec in cfgs.items():
        llms[name] = LLM.from_dict({"model": model, "cache": {"memory_gb": 0.25}, "speculative": spec})
        harness.warm_up(llms[name], chat=True)
    runs = harness.rounds(list(cfgs), args.repeats, lambda n: run_one(llms[n], clock, convs, params),
        describe=lambda r: f"{r['ms']['step']:.2f} ms/step, {r['rows']:.1f} rows, {r['tokens_per_step']:.2f} tok/step")
    curve = next((rs[-1]["cost_curve"] for rs in runs.values() if rs[-1]["cost_curve"]), None)
    rows = {}
    for name, rs in runs.items():
        ms = {k: spread([r["ms"][k] for r in rs], 3)["median"] for k in ("step", *STAGES, "rest")}
        fwd = rs[-1]["forward_by_rows"]
        rows[name] = {"tok_per_s": spread([r["tok_per_s"] for r in rs], 2),
                      "step_ms": spread([r["ms"]["step"] for r in rs], 3),
                      "stage_ms": ms, "rows_per_step": round(harness.median([r["rows"] for r in rs]), 2),
                      "tokens_per_step": round(harness.median([r["tokens_per_step"] for r in rs]), 3),
                      "verified_tree_nodes": rs[-1]["verified_nodes"],
                      "forward_ms_by_rows": {str(k): round(1e3 * v, 3) for k, v in sorted(fwd.items())}}
        bench.log(f"{name:>14}: {ms['step']:.2f} ms/step ({rows[name]['rows_per_step']} rows, "
                  f"{rows[name]['tokens_per_step']} tok/step): " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))
    bench.write({"model": f"SmolLM2-135M-Instruct ({args.dtype})", "prompts": len(convs),
                 "cost_curve": None if curve is None else {
                     "sizes": curve["sizes"], "ratios": [round(r, 3) for r in curve["ratios"]],
                     "t1_ms": round(1e3 * curve["t1_s"], 3) if curve.get("t1_s") else None},
                 "rows": rows})


if __name__ == "__main__":
    main()
