"""Soak test: resident memory across many rounds of the same workload.

Each round generates ``--requests`` requests (random-length prompts cut from
the standard-library corpus, random output lengths) through one long-lived
``LLM`` and records the process RSS afterwards (``VmRSS`` of
/proc/self/status, after ``gc.collect()``). A server runs rounds like these for
days, so memory must level off after the first rounds, not keep climbing.

``growth_mb`` compares the last round with the round after warm-up
(``--warmup-rounds``, default 3: the first rounds fill allocator pools and
caches that are then reused). Results go to
``benchmarks/results/soak_memory[_<tag>].json`` with the environment (``harness.py``).

    python benchmarks/soak_memory.py                       # demo pair, draft_model, 20 x 200
    python benchmarks/soak_memory.py --linear-backend default --tag default
    python benchmarks/soak_memory.py --no-row-buckets --tag unbucketed   # the behaviour before the fix
    python benchmarks/soak_memory.py --quick               # smoke test, seconds
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from pathlib import Path

import harness
from bench_models import token_prompts


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def parse_args() -> argparse.Namespace:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "soak_memory.json",
                           quick="4 rounds of 16 requests, seconds")
    ap.add_argument("--model", default=str(harness.REPO_ROOT / "models" / "demo-target"))
    ap.add_argument("--draft", default=str(harness.REPO_ROOT / "models" / "demo-draft"))
    ap.add_argument("--proposer", choices=("draft_model", "ngram", "none"), default="draft_model")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup-rounds", type=int, default=3)
    ap.add_argument("--linear-backend", choices=("auto", "default", "onednn"), default="auto")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--prompt-range", type=int, nargs=2, default=(8, 96))
    ap.add_argument("--output-range", type=int, nargs=2, default=(4, 48))
    ap.add_argument("--no-row-buckets", action="store_true",
                    help="run packed GEMMs on every row count as it comes (speculant/model/linear/rows.py "
                         "disabled): the unbounded shape set that made RSS grow")
    ap.add_argument("--tag", default="", help="the default --out becomes results/soak_memory_TAG.json")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests, args.warmup_rounds = 4, 16, 1
    if args.warmup_rounds >= args.rounds:
        ap.error(f"--warmup-rounds={args.warmup_rounds} must be below --rounds={args.rounds}")
    if args.tag and args.out == args._default_out:
        args.out = args._default_out = harness.RESULTS_DIR / f"soak_memory_{args.tag}.json"
    return args


def main() -> None:
    args = parse_args()
    bench = harness.start("soak_memory", args)
    from speculant import LLM, SamplingParams

    if args.no_row_buckets:
        import speculant.model.linear.rows as linear_rows

        linear_rows.EXACT_ROWS = 1 << 30

    spec = None
    if args.proposer == "draft_model":
        spec = {"proposer": "draft_model", "num_speculative_tokens": 4,
                "proposer_options": {"model": args.draft, "linear_backend": args.linear_backend}}
    elif args.proposer == "ngram":
        spec = {"proposer": "ngram", "num_speculative_tokens": 4}
    kwargs = {"speculative": spec} if spec else {}
    llm = LLM(model=args.model, linear_backend=args.linear_backend, max_num_seqs=args.max_num_seqs,
              max_model_len=256, **kwargs)
    rows = []
    start_rss = rss_mb()
    print(f"RSS after load: {start_rss:.1f} MB")
    for rnd in range(args.rounds):
        rng = random.Random(1000 + rnd)
        lengths = [rng.randint(*args.prompt_range) for _ in range(args.requests)]
        prompts = token_prompts(llm.tokenizer, lengths, seed=rnd)
        params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, ignore_eos=True,
                                 max_tokens=rng.randint(*args.output_range)) for i in range(args.requests)]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        gc.collect()
        rows.append({"round": rnd, "rss_mb": round(rss_mb(), 1), "seconds": round(seconds, 2),
                     "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs)})
        print(f"round {rnd:3d}: RSS {rows[-1]['rss_mb']:8.1f} MB  {seconds:6.1f} s  "
              f"{rows[-1]['output_tokens']} tokens", flush=True)
    base = rows[args.warmup_rounds - 1]["rss_mb"] if args.warmup_rounds else start_rss
    result = bench.write({  # the settings are the run's options, which the harness records
        "rss_after_load_mb": round(start_rss, 1),
        "rounds": rows,
        "growth_mb": round(rows[-1]["rss_mb"] - base, 1),
        "growth_from_mb": base,
    })
    print(f"growth after warm-up: {result['growth_mb']:+.1f} MB")


if __name__ == "__main__":
    main()
