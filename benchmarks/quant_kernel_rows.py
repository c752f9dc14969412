"""Kernel-level t(n)/t(1) of the quantized linear (csrc/quant_linear.c): one call of
n activation rows against one, for the 1.5B model's matrix shapes in Q4_K and Q6_K.

The weights are random blocks with sane scales (the kernel's cost does not depend
on the values). Per round every (format, shape, n) runs once, the order reversed
every other round; each run is the fastest of ``--calls`` calls (on a shared machine a
call that lost its core to another process measures the other process, not the kernel). Per cell: the
median seconds over rounds, the spread, and t(n)/t(1) as the median of each
round's own ratio.

    python benchmarks/quant_kernel_rows.py --out benchmarks/results/quant_kernel_rows.json
"""

from __future__ import annotations

import statistics

import numpy as np

import harness

SHAPES = {"gate/up 8960x1536": (8960, 1536), "down 1536x8960": (1536, 8960)}


def random_blocks(fmt_name: str, n: int, k: int, seed: int = 0):
    """[n, row_bytes] uint8 blocks of a K-quant with random codes and scales of ~1e-2."""
    import torch

    rng = np.random.default_rng(seed)
    nb = k // 256
    half = np.float16(0.01).view(np.uint16)
    if fmt_name == "Q4_K":
        b = rng.integers(0, 256, size=(n, nb, 144), dtype=np.uint8)
        b[..., 0], b[..., 1] = half & 0xff, half >> 8  # d
        b[..., 2], b[..., 3] = half & 0xff, half >> 8  # dmin
    else:
        b = rng.integers(0, 256, size=(n, nb, 210), dtype=np.uint8)
        b[..., 208], b[..., 209] = half & 0xff, half >> 8
    return torch.from_numpy(b.reshape(n, -1).copy())


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "quant_kernel_rows.json", repeats=5, threads=2)
    ap.add_argument("--sizes", default="1,2,3,4,6,8,12,16,24,32")
    ap.add_argument("--calls", type=int, default=15, help="calls per run (the fastest is the run's time)")
    ap.add_argument("--formats", default="Q4_K,Q6_K")
    ap.add_argument("--isa", default=None, help="force a kernel path (scalar, avx2, avx512_vnni)")
    args = ap.parse_args()
    bench = harness.start("quant_kernel_rows", args)
    import torch

    from speculant.model.linear.quantized import QUANT_FORMATS, QuantLinear, kernel_isa, set_kernel_isa

    if args.isa:
        set_kernel_isa(args.isa)
    type_ids = {f.name: t for t, f in QUANT_FORMATS.items()}
    sizes = [int(x) for x in args.sizes.split(",")]
    layers, inputs = {}, {}
    for fmt in args.formats.split(","):
        for shape, (n, k) in SHAPES.items():
            layers[(fmt, shape)] = QuantLinear(random_blocks(fmt, n, k), type_ids[fmt], k, None, torch.bfloat16)
            for rows in sizes:
                inputs[(shape, rows)] = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).bfloat16()
    cells = [f"{fmt}|{shape}|{rows}" for (fmt, shape) in layers for rows in sizes]

    def run_one(cell: str) -> float:
        fmt, shape, rows = cell.split("|")
        layer, x = layers[(fmt, shape)], inputs[(shape, int(rows))]
        return min(harness.time_calls(lambda: layer(x), args.calls, warmup=2))

    runs = harness.rounds(cells, args.repeats, run_one)
    table = []
    for (fmt, shape), layer in layers.items():
        base = runs[f"{fmt}|{shape}|1"]
        for rows in sizes:
            ts = runs[f"{fmt}|{shape}|{rows}"]
            ratio = statistics.median(t / b for t, b in zip(ts, base))
            gbps = layer.blocks.numel() / statistics.median(ts) / 1e9
            table.append(dict(format=fmt, shape=shape, rows=rows, median_s=statistics.median(ts), min_s=min(ts),
                              max_s=max(ts), ratio_to_1=ratio, weight_gb_per_s=gbps))
            bench.log(f"{fmt} {shape} n={rows:2d}: {1e3 * statistics.median(ts):7.3f} ms "
                      f"({1e3 * min(ts):.3f}-{1e3 * max(ts):.3f}) t(n)/t(1) {ratio:.2f}  {gbps:.1f} GB/s")
    bench.write({"isa": kernel_isa(), "rows": table})


if __name__ == "__main__":
    main()
