"""Time one linear layer for small row counts under each CPU route.

Why: speculative decoding pays only when verifying ``k + 1`` tokens costs about
as much as decoding one, so the linear layers must stay near the memory-bandwidth
bound for 1-16 rows. This script measures ms per call for every route below,
next to the bound (weight bytes / measured read bandwidth).

Routes (all exact up to float32 summation order):

* ``default``        ``F.linear`` with the stored ``[out, in]`` weight (MKL on CPU).
* ``onednn_packed``  weight reordered once by ``torch.ops.mkldnn._reorder_linear_weight``,
                     run by ``torch.ops.mkldnn._linear_pointwise`` (what
                     ``speculant.model.linear.backend`` uses).
* ``onednn_dense``   the same oneDNN op given the plain ``[out, in]`` weight (no
                     packed copy; oneDNN picks its kernel per call).
* ``mkldnn_utils``   the public ``torch.utils.mkldnn.to_mkldnn(linear)``; its input
                     must be converted ``to_mkldnn()`` and back ``to_dense()``.
* ``transposed``     weight stored ``[in, out]``, ``torch.addmm(bias, x, w_t)``.
* ``weight_left``    ``(w @ x.T).T + bias``: the small row count becomes GEMM's N.
* ``dot_bf16``       ``speculant.model.linear.dot_linear.DotLinear``: Speculant's own kernel
                     on AVX512-BF16 dot products (bfloat16, CPUs that have them;
                     what ``model.linear_backend = "auto"`` picks there).
* ``mkl_packed``     ``torch.ops.mkl._mkl_reorder_linear_weight`` packed for one
                     batch size (needs a packed copy per row count plus the
                     original weight, so it is listed for comparison only).
* ``compile_freezing`` (opt-in, slow) ``torch.compile`` with inductor freezing;
                     compiled once per row count and weight copy (use it with
                     ``--pool-mb 0``), compile seconds reported.

Weights are read from DRAM, not cache: each route cycles through enough copies
of the weight that the copies of all routes together exceed ``--pool-mb``
(default 1024 MiB, above this machine's L3). ``--pool-mb 0`` measures hot
(cache-resident) weights instead. Routes are interleaved call by call so that
load from other processes hits them alike. Each figure is the median over
``--repeats`` passes of the median of ``--reps`` calls (the JSON keeps every
pass's figure; load comes in bursts that can spoil one pass of a cell), and the
bound uses the best of the passes' bandwidth measurements
(``speculant.bench.bandwidth.read_bandwidth``). On a shared machine,
OpenMP threads waiting for a busy core inflate every figure; ``--threads 1`` is
steadier there.

Usage::

    python benchmarks/bench_linear.py                 # default run, ~1-2 min
    python benchmarks/bench_linear.py --rows 1,5,64,256 --routes default,onednn_packed
    python benchmarks/bench_linear.py --quick         # smoke test, seconds
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import torch.utils.mkldnn

import harness

DEFAULT_SHAPES = "768x32000,768x3072,3072x768,2048x2048,2048x5632,4096x4096"
DEFAULT_ROUTES = ("default,onednn_packed,onednn_dense,mkldnn_utils,transposed,weight_left,"
                  "mkl_packed")

Call = Callable[[torch.Tensor], torch.Tensor]


def read_bandwidth(quick: bool) -> float:
    """Read bandwidth in bytes/s: the best repeat of ``sum()`` over a tensor larger than L3."""
    from speculant.bench.bandwidth import read_bandwidth as measure

    return measure(1 << 26 if quick else 1 << 30, 2 if quick else 5)["best_gb_s"] * 1e9


def build_route(route: str, weight: torch.Tensor, bias: torch.Tensor, rows: int) -> Call:
    """Return ``fn(x [rows, in]) -> [rows, out]`` for one weight copy ``[out, in]``."""
    if route in ("default", "onednn_dense", "weight_left"):
        # A private copy: a route must not find its weight in cache because the
        # route timed just before it read the same tensor.
        weight = weight.clone()
    if route == "default":
        return lambda x: F.linear(x, weight, bias)
    if route == "onednn_packed":
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if route == "onednn_dense":
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    if route == "mkldnn_utils":
        layer = torch.nn.Linear(weight.shape[1], weight.shape[0])
        layer.weight.data, layer.bias.data = weight, bias
        mk = torch.utils.mkldnn.to_mkldnn(layer, weight.dtype)
        return lambda x: mk(x.to_mkldnn()).to_dense()
    if route == "transposed":
        w_t = weight.t().contiguous()  # [in, out]
        return lambda x: torch.addmm(bias, x, w_t)
    if route == "weight_left":
        return lambda x: torch.mm(weight, x.t()).t().add_(bias)
    if route == "dot_bf16":
        from speculant.model.linear.dot_linear import DotLinear

        return DotLinear(weight, bias).forward
    if route == "mkl_packed":
        if weight.dtype != torch.float32:
            raise ValueError("route 'mkl_packed' is float32 only; drop it with --routes")
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        return lambda x: torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)
    raise ValueError(f"unknown route {route!r}; choose from {DEFAULT_ROUTES},dot_bf16,compile_freezing")


def build_compiled(weight: torch.Tensor, bias: torch.Tensor, rows: int) -> tuple[Call, float]:
    """Inductor with freezing, compiled for one static row count; returns (fn, seconds)."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype)
    layer.weight.data, layer.bias.data = weight, bias
    fn = torch.compile(layer, dynamic=False)
    start = time.perf_counter()
    with torch.no_grad():
        fn(torch.randn(rows, weight.shape[1], dtype=weight.dtype))
    return fn, time.perf_counter() - start


def time_shape(in_f: int, out_f: int, rows_list: list[int], routes: list[str], reps: int,
               pool_bytes: int, dtype: torch.dtype) -> dict:
    """Median ms per call for every (route, rows) of one ``in_f x out_f`` layer."""
    weight_bytes = in_f * out_f * dtype.itemsize
    copies = max(1, math.ceil(pool_bytes / (weight_bytes * len(routes))))
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(out_f, in_f, generator=gen) * in_f**-0.5).to(dtype)
               for _ in range(copies)]
    bias = (torch.randn(out_f, generator=gen) * 0.02).to(dtype)
    result: dict = {"copies_per_route": copies, "compile_s": {}}
    for key in ("ms", "max_rel_error"):  # error vs a float64 reference
        result[key] = {r: {} for r in routes}
    static = {r: [build_route(r, w, bias, 1) for w in weights] for r in routes
              if r not in ("mkl_packed", "compile_freezing")}
    for rows in rows_list:
        fns = dict(static)
        for r in routes:
            if r == "mkl_packed":
                fns[r] = [build_route(r, w, bias, rows) for w in weights]
            elif r == "compile_freezing":
                built = [build_compiled(w, bias, rows) for w in weights]
                fns[r] = [fn for fn, _ in built]
                result["compile_s"][rows] = round(sum(s for _, s in built) / len(built), 2)
        x = torch.randn(rows, in_f, generator=gen).to(dtype)
        samples: dict[str, list[float]] = {r: [] for r in routes}
        for i in range(reps + copies):  # the first `copies` calls are warm-up
            for r in routes:
                fn = fns[r][i % copies]
                start = time.perf_counter()
                fn(x)
                elapsed = time.perf_counter() - start
                if i >= copies:
                    samples[r].append(elapsed)
        ref = F.linear(x.double(), weights[0].double(), bias.double())  # [rows, out]
        for r in routes:
            result["ms"][r][rows] = round(statistics.median(samples[r]) * 1e3, 3)
            error = (fns[r][0](x).double() - ref).abs().max() / ref.abs().max()
            result["max_rel_error"][r][rows] = float(f"{error.item():.2e}")
    return result


def route_table(results: dict, rows_list: list[int], routes: list[str]) -> str:
    """One line per (shape, route), columns = rows, plus the bandwidth bound."""
    head = "| layer (in×out) | route | " + " | ".join(f"{r} rows" for r in rows_list)
    lines = [head + " | bound |", "|" + "---|" * (len(rows_list) + 3)]
    for shape, res in results["shapes"].items():
        for r in routes:
            cells = " | ".join(f"{res['ms'][r][n]:.3f}" for n in rows_list)
            lines.append(f"| {shape} | {r} | {cells} | {res['bound_ms']:.3f} |")
    return "\n".join(lines)


def merge_repeats(runs: list[dict], routes: list[str], rows_list: list[int]) -> dict:
    """Per cell, the median over repeats of each repeat's median (load comes in bursts
    that can spoil a whole repeat of a cell; the median across repeats discards them)."""
    merged = {"copies_per_route": runs[0]["copies_per_route"], "compile_s": runs[0]["compile_s"],
              "ms": {}, "ms_per_repeat": {}, "max_rel_error": runs[0]["max_rel_error"]}
    for r in routes:
        per_repeat = {n: [run["ms"][r][n] for run in runs] for n in rows_list}
        merged["ms_per_repeat"][r] = per_repeat
        merged["ms"][r] = {n: round(statistics.median(v), 3) for n, v in per_repeat.items()}
    return merged


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "linear_backends.json", repeats=3, dtype="float32",
                           quick="one 256x1024 layer, 1 and 5 rows, two routes, one pass")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of INxOUT")
    ap.add_argument("--rows", default="1,2,5,8,16", help="comma list of row counts")
    ap.add_argument("--routes", default=DEFAULT_ROUTES, help="comma list of routes")
    ap.add_argument("--reps", type=int, default=11, help="timed calls per cell and pass")
    ap.add_argument("--pool-mb", type=int, default=1024,
                    help="MiB of weight copies cycled through (0 = cache-hot)")
    args = ap.parse_args()
    if args.quick:
        args.shapes, args.rows, args.routes, args.reps, args.repeats, args.pool_mb = \
            "256x1024", "1,5", "default,onednn_packed", 3, 1, 16
    rows_list = [int(n) for n in args.rows.split(",")]
    dtype = getattr(torch, args.dtype)
    routes = args.routes.split(",")
    shapes = args.shapes.split(",")
    bench = harness.start("linear_backends", args)
    results: dict = {"dtype": args.dtype, "pool_mb": args.pool_mb, "reps": args.reps, "repeat": args.repeats,
                     "rows": rows_list, "shapes": {}}
    bandwidths, runs = [], {shape: [] for shape in shapes}
    with torch.inference_mode():
        for repeat in range(args.repeats):
            bandwidths.append(read_bandwidth(args.quick))
            for shape in shapes:
                in_f, out_f = (int(v) for v in shape.split("x"))
                runs[shape].append(time_shape(in_f, out_f, rows_list, routes, args.reps,
                                              args.pool_mb << 20, dtype))
            bench.log(f"pass {repeat + 1}/{args.repeats} done")
    bandwidth = max(bandwidths)  # the least disturbed measurement
    results["read_bandwidth_gb_s_per_repeat"] = [round(b / 1e9, 2) for b in bandwidths]
    results["read_bandwidth_gb_s"] = round(bandwidth / 1e9, 2)
    for shape in shapes:
        in_f, out_f = (int(v) for v in shape.split("x"))
        results["shapes"][shape] = merge_repeats(runs[shape], routes, rows_list)
        results["shapes"][shape]["bound_ms"] = round(
            in_f * out_f * dtype.itemsize / bandwidth * 1e3, 3)
    written = bench.write(results)
    env = written["environment"]
    print(f"\nread bandwidth {results['read_bandwidth_gb_s']} GB/s, {env['torch_threads']} threads, "
          f"load {env['load_avg']} -> {env['load_avg_end']}, ms per call:\n")
    print(route_table(results, rows_list, routes))


if __name__ == "__main__":
    main()
