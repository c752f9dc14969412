"""The target forward's cost against its token count: the cost model of the
adaptive draft-length policy (``speculative.draft_length.token_cost``).

SmolLM2-135M-Instruct (``--dtype``, float32 by default; the engine's defaults), no speculation: n
requests decode together (n = 1 .. 64), so each step is one target forward
over n tokens; the median score time of the decode-only steps at each n is
fitted with T(n) = a + b * n (least squares). The policy's ``token_cost`` is
b / (a + b): one more token's share of a one-token forward. Drafts are rows
of the same forward, so they cost what a decode row costs (to within the
attention over the prefix, which is small at these lengths).

    nice -n 10 python benchmarks/verify_cost.py
"""

from __future__ import annotations

import statistics

import harness


def step_times(llm, n: int, steps: int) -> list[float]:
    from speculant import SamplingParams

    eng = llm.engine
    for i in range(n):
        eng.add_request(None, [100 + (7 * i + j) % 900 for j in range(16)],
                        SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True))
    times = []
    while eng.has_unfinished_requests():
        before = eng.times.score_s
        decoding = sum(r.is_decoding for r in eng.scheduler.running)
        waiting = len(eng.scheduler.waiting)
        eng.step()
        if decoding == n and not waiting:
            times.append(eng.times.score_s - before)
    return times


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "verify_cost.json", dtype="float32")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,48,64")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    bench = harness.start("verify_cost", args)
    llm = harness.smollm2_llm(dtype=args.dtype)
    step_times(llm, 2, 2)  # warm-up
    sizes = [int(x) for x in args.sizes.split(",")]
    medians = {}
    for n in sizes:
        t = step_times(llm, n, args.steps)
        medians[n] = statistics.median(t)
        print(f"{n:3d} tokens: {1e3 * medians[n]:7.2f} ms (median of {len(t)})", flush=True)
    xs, ys = list(medians), list(medians.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    token_cost = b / (a + b)
    print(f"T(n) = {1e3 * a:.2f} ms + {1e3 * b:.3f} ms * n  ->  token_cost = {token_cost:.3f}")
    bench.write({"label": f"{bench.env['cpu']}, {bench.env['date_utc'][:10]}",
                 "model": f"SmolLM2-135M-Instruct ({args.dtype})", "median_forward_s_by_tokens": medians,
                 "fit_fixed_s": a, "fit_per_token_s": b, "token_cost": token_cost})


if __name__ == "__main__":
    main()
