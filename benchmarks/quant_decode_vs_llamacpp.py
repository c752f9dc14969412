"""Decode and small-batch prefill on a quantized GGUF: Speculant's quantized kernels
(``model.quantization = "gguf"``) against llama.cpp's ``llama-bench`` on the same file,
side by side in one run (issue 51).

Each round runs, in alternating order:

* ``speculant``: one ``--depth``-token prompt, then ``--gen`` greedy tokens
  (EOS ignored); decode rate = (gen - 1) / (time of the whole request - time of
  the same request stopped after its first token), so the prefill is left out as
  llama-bench's ``tg`` leaves it out;
* ``llama.cpp``: ``llama-bench -p 0 -n GEN -d DEPTH -t THREADS -r 1``, its tg
  rate at the same depth.

Rows: the median tok/s of each over the rounds, the spread (min, max), and the
median of the per-round ratio ours / llama.cpp. ``--pp-sizes`` adds llama.cpp's
prompt rate at small batch sizes (``-p n -n 0 -d DEPTH``), from which t(n)/t(1)
of its forward follows (compare ``verify_rows.py`` for ours).

    python benchmarks/quant_decode_vs_llamacpp.py --llama-bench /work/llama-build/bin/llama-bench
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from bench_speculative import forward_times
from selftest_check import model_path

import harness


def llama_bench(binary: str, model: str, args, prompt: int, gen: int, repeats: int = 1) -> dict:
    cmd = [binary, "-m", model, "-p", str(prompt), "-n", str(gen), "-d", str(args.depth), "-t", str(args.threads),
           "-r", str(repeats), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=True)
    rec = json.loads(out.stdout)[0]
    return {"avg_ts": rec["avg_ts"], "samples_ts": rec.get("samples_ts"), "command": " ".join(cmd)}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "quant_decode_qwen15b_q4km.json", repeats=5,
                            dtype="bfloat16", threads=2)
    ap.add_argument("--model", default="qwen-1.5b-q4km", help="a fetch_gguf_parts name or a .gguf path")
    ap.add_argument("--llama-bench", default="/work/llama-build/bin/llama-bench")
    ap.add_argument("--depth", type=int, default=120, help="tokens already in the context")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--pp-sizes", default="1,2,4,8,16,32",
                    help="row counts n for t(n)/t(1): ours (forwards of n rows over --depth cached tokens) and "
                         "llama.cpp's prompt rate at batch n ('' for none)")
    args = ap.parse_args()
    bench = harness.start("quant_decode_vs_llamacpp", args)
    from speculant import LLM, SamplingParams

    path = model_path(args.model)
    llm = LLM(model=path, dtype=args.dtype, max_num_seqs=1, max_num_batched_tokens=max(256, args.depth + 8))
    runner = llm.engine.runner
    import psutil

    from speculant.model.loading.gguf_quant import resident_weight_bytes

    memory = {"file_bytes": Path(path).stat().st_size, "weight_bytes": resident_weight_bytes(runner.model),
              "process_rss_bytes": psutil.Process().memory_info().rss}
    bench.log(f"memory: {memory}")
    prompt = [(1000 + i) % runner.vocab_size for i in range(args.depth)]

    def ours() -> dict:
        first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        full = SamplingParams(temperature=0, max_tokens=args.gen, ignore_eos=True)
        with harness.timed() as t1:
            llm.generate([prompt], first, use_tqdm=False)
        with harness.timed() as tn:
            llm.generate([prompt], full, use_tqdm=False)
        return {"tok_s": (args.gen - 1) / (tn.wall - t1.wall), "first_token_s": t1.wall}

    def run_one(name: str) -> dict:
        return ours() if name == "speculant" else llama_bench(args.llama_bench, path, args, 0, args.gen)

    ours()  # warm-up
    runs = harness.rounds(["speculant", "llama.cpp"], args.repeats, run_one,
                          lambda r: f"{r.get('tok_s', r.get('avg_ts')):.2f} tok/s")
    mine = [r["tok_s"] for r in runs["speculant"]]
    theirs = [r["avg_ts"] for r in runs["llama.cpp"]]
    ratios = [a / b for a, b in zip(mine, theirs)]
    rows = [{"engine": "speculant", "tok_s": harness.median(mine), "min": min(mine), "max": max(mine)},
            {"engine": "llama.cpp", "tok_s": harness.median(theirs), "min": min(theirs), "max": max(theirs)}]
    bench.log(f"decode at depth {args.depth}: ours {rows[0]['tok_s']:.2f} tok/s ({min(mine):.2f}-{max(mine):.2f}), "
              f"llama.cpp {rows[1]['tok_s']:.2f} ({min(theirs):.2f}-{max(theirs):.2f}), "
              f"ratio {harness.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
    sizes = [int(x) for x in args.pp_sizes.split(",") if x]
    ours_rows = []
    if sizes:
        times = forward_times(llm.engine.view, args.depth, sizes, args.repeats)
        for n in sizes:
            ratio = statistics.median(times[n][r] / times[sizes[0]][r] for r in range(args.repeats))
            ours_rows.append({"rows": n, "median_s": harness.median(times[n]), "min_s": min(times[n]),
                              "max_s": max(times[n]), "ratio_to_1": ratio if sizes[0] == 1 else None})
            bench.log(f"ours n={n:3d}: {1e3 * ours_rows[-1]['median_s']:.2f} ms, t(n)/t(1) {ratio:.2f}")
    pp = []
    for n in sizes:
        rec = llama_bench(args.llama_bench, path, args, n, 0, repeats=args.repeats)
        samples = rec["samples_ts"] or [rec["avg_ts"]]
        times = sorted(n / ts for ts in samples)
        pp.append({"rows": n, "median_s": harness.median(times), "min_s": times[0], "max_s": times[-1]})
    for row in pp:
        row["ratio_to_1"] = row["median_s"] / pp[0]["median_s"] if pp and pp[0]["rows"] == 1 else None
        bench.log(f"llama.cpp n={row['rows']:3d}: {1e3 * row['median_s']:.2f} ms, t(n)/t(1) {row['ratio_to_1']:.2f}")
    bench.write({"model": args.model, "file": path, "dtype": args.dtype, "depth": args.depth, "gen": args.gen,
                 "quantized_layers": runner.quant_report.describe() if runner.quant_report else None,
                 "forward_path": runner.fast_forward.describe(), "rows": rows, "memory": memory,
                 "ratio_median": harness.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                 "runs": runs, "ours_rows": ours_rows, "llamacpp_prompt_rows": pp})


if __name__ == "__main__":
    main()
