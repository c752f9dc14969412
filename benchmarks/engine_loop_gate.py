"""The engine loop's speed gate: SmolLM2 bf16 at batch 1 and with 32 requests, a checkout against this one.

Two worker processes load the same model, one importing ``speculant`` from
``--base`` (a checkout of the code before the change), one from this
repository; each then runs what ``speculant bench`` runs
(``speculant.bench.speculant_runs.run_method``, its own checkout's version):
at batch 1 each prompt alone, streamed step by step (4 chat prompts x
``--max-tokens``), and 32 requests at once through ``LLM.generate``
(the 4 prompts repeated, ``--max-tokens-c32`` each). Greedy, EOS ignored,
prefix caching off, the GGUF dequantized to bf16 on both sides. The workers take turns, round by round, the order
reversed every other round (``harness.rounds``); the figures are the medians
of tokens/s and the per-round ratios branch / base with their spread, on the
wall clock and per CPU second of the worker process (``*_cpu``: blind to time
spent descheduled, so steadier on a shared machine; with ``--threads 1`` it
counts no OpenMP spinning either). Both sides must produce the same tokens
(checked by digest).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness

MARK = "GATE "
NAMES = ["base", "branch"]
WORKLOADS = {"bs1": 1, "c32": 32}


def worker(args) -> None:
    """In a child process: load once, then answer one measurement per line read."""
    import speculant
    from repeated_tasks import conversations
    from speculant.bench import render_prompts
    from speculant.bench.speculant_runs import Method, build_llm, run_method
    from speculant.config.models import ModelConfig

    harness.pin_threads(args.threads)
    # bf16 weights on both sides: a checkout that keeps a GGUF's blocks quantized by default
    # (model.quantization, issue 51) dequantizes them here, as checkouts before that option always did
    extra = {"quantization": "dequantize"} if "quantization" in ModelConfig.model_fields else {}
    llm = build_llm(harness.smollm2_path(), Method("no_spec"), 32, args.dtype, **extra)
    texts = [c[-1]["content"] for c in conversations("edit")[: args.num_prompts]]
    prompts = render_prompts(llm.tokenizer, texts, chat=True)
    print(MARK + json.dumps({"ready": speculant.__file__}), flush=True)
    for _ in sys.stdin:
        out: dict[str, Any] = {}
        for name, concurrency in WORKLOADS.items():
            max_tokens = args.max_tokens if concurrency == 1 else args.max_tokens_c32
            t0 = harness.stamp()
            res = run_method(llm, prompts, max_tokens, concurrency, repeats=1)
            _, cpu = harness.since(t0)  # the process's CPU seconds (warm-up included): blind to time descheduled
            digest = hashlib.sha256(json.dumps(res["token_ids"]).encode()).hexdigest()[:16]
            out[name] = res["tokens_per_s"]
            out[name + "_cpu"] = res["num_tokens"] / cpu
            out[name + "_tokens"] = res["num_tokens"]
            out[name + "_digest"] = digest
        print(MARK + json.dumps(out), flush=True)


class Worker:
    def __init__(self, checkout: Path, args) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(Path(__file__).parent)])}
        cmd = [sys.executable, __file__, "--worker", "--dtype", args.dtype, "--max-tokens", str(args.max_tokens),
               "--max-tokens-c32", str(args.max_tokens_c32), "--num-prompts", str(args.num_prompts)]
        if args.threads is not None:
            cmd += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd="/")
        self.ready = self.read()["ready"]
        if not self.ready.startswith(str(checkout)):
            raise SystemExit(f"the worker for {checkout} imported speculant from {self.ready}")

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise SystemExit(f"a worker ended (exit {self.proc.wait()}) before answering")

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "engine_loop_gate.json", repeats=5,
                            dtype="bfloat16", threads=2)
    ap.add_argument("--base", type=Path, default=Path("/work/wt-base"), help="checkout of the code before")
    ap.add_argument("--branch", type=Path, default=harness.REPO_ROOT,
                    help="checkout of the code after (default: this one)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per request at batch 1")
    ap.add_argument("--max-tokens-c32", type=int, default=64, help="tokens per request with 32 requests")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--worker", action="store_true", help=argparse_hidden())
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    bench = harness.start("engine_loop_gate", args)
    workers = {"base": Worker(args.base.resolve(), args), "branch": Worker(args.branch.resolve(), args)}
    try:
        runs = harness.rounds(NAMES, args.repeats, lambda name: workers[name].run(),
                              describe=lambda r: ", ".join(f"{w} {r[w]:.1f} tok/s ({r[w + '_cpu']:.1f} per CPU s)"
                                                              for w in WORKLOADS))
    finally:
        for w in workers.values():
            w.close()
    results = {}
    for w in [*WORKLOADS, *(f"{w}_cpu" for w in WORKLOADS)]:
        meds = harness.medians(runs, w)
        ratios = harness.per_round_ratios(runs, "branch", "base", w)
        digests = {r[w.removesuffix("_cpu") + "_digest"] for rs in runs.values() for r in rs}
        results[w] = {"tokens_per_s": {n: round(v, 2) for n, v in meds.items()},
                      "branch_over_base": harness.summary(ratios, 4),
                      "same_tokens": len(digests) == 1}
        bench.log(f"{w}: base {meds['base']:.1f}, branch {meds['branch']:.1f} tok/s; branch/base per round "
                  f"median {harness.median(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f}); "
                  f"same tokens: {len(digests) == 1}")
    bench.write({"base": {"path": str(args.base), "speculant": workers["base"].ready},
                 "branch": {"path": str(args.branch), "speculant": workers["branch"].ready},
                 "results": results, "runs": runs})


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
