"""What a forward of n query rows costs against one, t(n)/t(1), on one model:
the figure that decides how far speculation can go at that size.

One sequence with a cached prefix of ``--ctx`` tokens; a forward of its next n
tokens (logits at every row, as a verify) for each n in ``--sizes``, the sizes
interleaved call by call over ``--repeats`` rounds so load drift hits them
alike. Per size: the median seconds, the spread (min, max), and t(n)/t(1) as the
median of each round's own ratio.

    python benchmarks/verify_rows.py --model qwen-1.5b-q4km --dtype bfloat16 --quantization dequantize \\
        --out benchmarks/results/verify_rows_qwen15b_bf16.json
    python benchmarks/verify_rows.py --model qwen-1.5b-q4km --out benchmarks/results/verify_rows_qwen15b_q4k.json
"""

from __future__ import annotations

import statistics

from bench_speculative import forward_times
from selftest_check import model_path

import harness


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "verify_rows.json", repeats=7, dtype="bfloat16",
                            threads=2)
    ap.add_argument("--model", default="smollm2", help="smollm2, a fetch_gguf_parts name, or a path")
    ap.add_argument("--sizes", default="1,2,3,4,5,6,8,10,12,16,24,32")
    ap.add_argument("--ctx", type=int, default=256, help="cached prefix tokens")
    ap.add_argument("--backend", default="cpu_kernel")
    ap.add_argument("--quantization", default="gguf", choices=["gguf", "dequantize"],
                    help="for a quantized GGUF: keep its blocks (our quantized kernels) or dequantize to --dtype")
    args = ap.parse_args()
    bench = harness.start("verify_rows", args)
    from speculant import LLM

    sizes = [int(x) for x in args.sizes.split(",")]
    llm = LLM(model=model_path(args.model), dtype=args.dtype, attention_backend=args.backend,
              quantization=args.quantization,
              max_num_batched_tokens=max(64, max(sizes)), max_num_seqs=4)
    times = forward_times(llm.engine.view, args.ctx, sizes, args.repeats)
    rounds = range(args.repeats)
    rows = []
    for n in sizes:
        ratio = statistics.median(times[n][r] / times[1][r] for r in rounds) if 1 in times else None
        rows.append(dict(rows=n, median_s=statistics.median(times[n]), min_s=min(times[n]), max_s=max(times[n]),
                         ratio_to_1=ratio))
        bench.log(f"n={n:3d}: {1e3 * rows[-1]['median_s']:8.2f} ms ({1e3 * min(times[n]):.2f}-"
                  f"{1e3 * max(times[n]):.2f}), t(n)/t(1) {ratio:.2f}" if ratio else f"n={n}")
    runner = llm.engine.runner
    quant = runner.quant_report.describe() if runner.quant_report else "none (dense weights)"
    bench.write({"model": args.model, "dtype": args.dtype, "backend": args.backend, "ctx": args.ctx,
                 "quantization": args.quantization, "quantized_layers": quant,
                 "forward_path": runner.fast_forward.describe(), "kernels": runner.kernel_report,
                 "linear_backend": runner.linear_report.describe(), "rows": rows})


if __name__ == "__main__":
    main()
