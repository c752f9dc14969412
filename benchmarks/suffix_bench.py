"""Suffix decoding vs prompt lookup on a repeated-task workload (issue 16, item 3).

SmolLM2-135M-Instruct (``scripts/smollm2_path.py``), greedy, bs = 1, float32:
the 20 requests of ``repeated_tasks.py`` (one edit, 20 snippets) run one after
another through one engine, as an agent would send them, for each config:

* ``none``: no speculation;
* ``ngram``: prompt lookup, as in ``examples/smollm2.toml`` (min_n 2, max_n 4);
* ``suffix``: the suffix proposer with its defaults (its global cache starts
  empty and fills with each finished reply);
* ``suffix_nocache``: the same with ``max_cached_requests = 0`` (what the
  request's own text gives), to show what the cache adds.

All configs use k = 8. Configs alternate within each repeat (a fresh engine
each time, so each run starts with an empty cache) to share the machine's
noise; the figures are the medians over repeats of output tokens / generation
wall time and / the process's CPU time (one torch thread; on a shared machine
wall time mostly measures the other tenants, CPU time the work done).
Every config's tokens must equal no speculation's (checked).
The proposer's own cost is reported as ``propose_s`` per output token.

    nice -n 10 python benchmarks/suffix_bench.py --repeats 3
"""

from __future__ import annotations

import json
import statistics

import harness
from repeated_tasks import SNIPPETS, conversations
from spec_replay import replay

CONFIGS = {
    "none": {},
    "ngram": {"proposer": "ngram", "proposer_options": {"min_n": 2, "max_n": 4}},
    "suffix": {"proposer": "suffix"},
    "suffix_nocache": {"proposer": "suffix", "proposer_options": {"max_cached_requests": 0}},
}


# option variants replayed on the recorded outputs (exact steps, no model, no machine noise)
REPLAYS = [
    ("ngram", {"min_n": 2, "max_n": 4}),
    ("ngram", {"min_n": 1, "max_n": 3}),
    ("suffix", {}),
    ("suffix", {"max_spec_factor": 2.0}),
    ("suffix", {"max_spec_factor": 4.0}),
    ("suffix", {"max_spec_factor": 4.0, "max_cached_requests": 0}),
]


def run_config(name: str, task: str, k: int, max_tokens: int, num: int) -> dict:
    from speculant import SamplingParams

    llm = harness.smollm2_llm(CONFIGS[name], k=k)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    harness.warm_up(llm)
    llm.engine.reset_metrics()
    tokens, prompts, seconds, cpu = [], [], [], []
    for conv in conversations(task)[:num]:
        with harness.timed() as t:
            out = llm.chat(conv, params, use_tqdm=False)[0]
        seconds.append(t.wall)
        cpu.append(t.cpu)
        tokens.append(list(out.outputs[0].token_ids))
        prompts.append(list(out.prompt_token_ids))
    m = llm.get_metrics()
    total = sum(len(t) for t in tokens)
    return {"tok_per_s": total / sum(seconds), "output_tokens": total, "seconds": sum(seconds),
            "cpu_seconds": sum(cpu), "tok_per_cpu_s": total / sum(cpu),
            "per_request_s": seconds, "token_ids": tokens, "prompt_ids": prompts,
            "mean_accepted_length": m.get("mean_accepted_length", 0.0),
            "acceptance_rate": m.get("acceptance_rate", 0.0),
            "propose_us_per_token": 1e6 * m["propose_s"] / total}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "suffix_repeated.json", repeats=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--task", default="unittest", choices=["unittest", "edit"])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num", type=int, default=len(SNIPPETS))
    args = ap.parse_args()
    names = args.configs.split(",")
    bench = harness.start("suffix_repeated_task", args)
    runs = harness.rounds(
        names, args.repeats, lambda name: run_config(name, args.task, args.k, args.max_tokens, args.num),
        lambda res: f"{res['tok_per_s']:6.2f} tok/s  {res['tok_per_cpu_s']:6.2f} tok/cpu-s  "
                    f"accepted/step {res['mean_accepted_length']:.2f}  "
                    f"propose {res['propose_us_per_token']:.1f} us/token")
    reference = runs[names[0]][0]["token_ids"]
    summary = {}
    for name, rs in runs.items():
        summary[name] = {
            "median_tok_per_s": statistics.median(x["tok_per_s"] for x in rs),
            "median_tok_per_cpu_s": statistics.median(x["tok_per_cpu_s"] for x in rs),
            "tok_per_s": [x["tok_per_s"] for x in rs],
            "mean_accepted_length": statistics.median(x["mean_accepted_length"] for x in rs),
            "acceptance_rate": statistics.median(x["acceptance_rate"] for x in rs),
            "propose_us_per_token": statistics.median(x["propose_us_per_token"] for x in rs),
            "output_tokens": rs[0]["output_tokens"],
            "identical_to_first_config": all(x["token_ids"] == reference for x in rs),
        }
    for base in ("none", "ngram"):
        if base in summary:
            for unit, prefix in (("s", ""), ("cpu_s", "cpu_")):
                key = f"median_tok_per_{unit}"
                for name, ratio in harness.ratios({n: s[key] for n, s in summary.items()}, base).items():
                    summary[name][f"{prefix}speedup_vs_{base}"] = ratio
    recorded = list(zip(runs[names[0]][0]["prompt_ids"], reference))
    replays = [replay(name, options, recorded, args.k) for name, options in REPLAYS]
    for r in replays:
        print(f"replay {r['proposer']:7s} {json.dumps(r['options']):60s} tokens/step {r['tokens_per_step']:.2f}  "
              f"drafts/step {r['drafts_per_step']:.2f}  propose {r['propose_us_per_output_token']:.1f} us/token")
    bench.write({
        "label": f"{bench.env['cpu']}, {bench.env['date_utc'][:10]}",
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32)",
        "workload": f"{args.num} '{args.task}' requests one after another: the same instruction on different "
                    "snippets (benchmarks/repeated_tasks.py), chat template, greedy, bs=1",
        "k": args.k, "max_tokens": args.max_tokens, "repeats": args.repeats, "summary": summary,
        "replay": replays,  # prompts once, in recorded_outputs
        "recorded_outputs": [{"prompt": p, "output": o} for p, o in recorded],
        "runs": {n: [{k: v for k, v in x.items() if k not in ("token_ids", "prompt_ids")} for x in rs]
                 for n, rs in runs.items()}})
    for name, s in summary.items():
        print(f"{name:15s} {s['median_tok_per_s']:6.2f} tok/s  vs ngram {s.get('speedup_vs_ngram', 0):.2f}x "
              f"(cpu {s.get('cpu_speedup_vs_ngram', 0):.2f}x)  "
              f"vs none {s.get('speedup_vs_none', 0):.2f}x  identical {s['identical_to_first_config']}")


if __name__ == "__main__":
    main()
