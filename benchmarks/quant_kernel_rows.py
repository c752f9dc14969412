"""Kernel-level t(n)/t(1) of the quantized linear (csrc/quant_linear.c): one call of
n activation rows against one, per matrix (a format and a shape: by default the 1.5B
model's in Q4_K and Q6_K; ``--matrices`` names others, such as the 0.5B draft's Q5_0 and
Q8_0 or SmolLM2's Q4_1) and per layout (``--layouts``: the file's rows, or repacked in
groups of 16 rows where the format has that layout).

The weights are random blocks with sane scales (the kernel's cost does not depend
on the values). Per round every (format, shape, n) runs once, the order reversed
every other round; each run is the fastest of ``--calls`` calls (on a shared machine a
call that lost its core to another process measures the other process, not the kernel). Per cell: the
median seconds over rounds, the spread, and t(n)/t(1) as the median of each
round's own ratio.

    python benchmarks/quant_kernel_rows.py --out benchmarks/results/quant_kernel_rows.json
    python benchmarks/quant_kernel_rows.py --matrices Q5_0:4864x896,Q4_K:4864x896 --layouts file,x16
"""

from __future__ import annotations

import statistics

import numpy as np

import harness

MATRICES = "Q4_K:8960x1536,Q4_K:1536x8960,Q6_K:8960x1536,Q6_K:1536x8960"
"""The default ``--matrices``: FORMAT:NxK (N output rows of K weights), the 1.5B model's gate/up and down."""
SCALE_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
"""Byte offsets of each format's float16 scale fields in its block: set to ~1e-2, the rest random codes."""


def random_blocks(fmt, n: int, k: int, seed: int = 0):
    """[n, row_bytes] uint8 blocks of ``fmt`` (a QuantFormat) with random codes and scales of ~1e-2."""
    import torch

    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, k // fmt.block_elems, fmt.block_bytes), dtype=np.uint8)
    half = np.float16(0.01).view(np.uint16)
    for at in SCALE_AT[fmt.name]:
        b[..., at], b[..., at + 1] = half & 0xff, half >> 8
    return torch.from_numpy(b.reshape(n, -1).copy())


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "quant_kernel_rows.json", repeats=5, threads=2)
    ap.add_argument("--sizes", default="1,2,3,4,6,8,12,16,24,32")
    ap.add_argument("--calls", type=int, default=15, help="calls per run (the fastest is the run's time)")
    ap.add_argument("--matrices", default=MATRICES, help="FORMAT:NxK,... (default: %(default)s)")
    ap.add_argument("--layouts", default="file", help="file, x16 (repacked where the format has it), or both")
    ap.add_argument("--isa", default=None, help="force a kernel path (scalar, avx2, avx512_vnni)")
    args = ap.parse_args()
    bench = harness.start("quant_kernel_rows", args)
    import torch

    from speculant.model.linear.quantized import QUANT_FORMATS, QuantLinear, kernel_isa, set_kernel_isa, stored_blocks

    if args.isa:
        set_kernel_isa(args.isa)
    by_name = {f.name: f for f in QUANT_FORMATS.values()}
    sizes = [int(x) for x in args.sizes.split(",")]
    layers, inputs = {}, {}
    for spec in args.matrices.split(","):
        name, shape = spec.split(":")
        n, k = (int(v) for v in shape.split("x"))
        for layout in args.layouts.split(","):
            kept, fmt = stored_blocks(random_blocks(by_name[name], n, k), by_name[name], k, repack=layout == "x16")
            if layout == "x16" and fmt.group_rows == 1:
                continue  # no repacked layout for this format (or this K)
            layers[(fmt.name, shape)] = QuantLinear(kept, fmt.type_id, k, None, torch.bfloat16, n)
            for rows in sizes:
                inputs[(k, rows)] = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).bfloat16()
    cells = [f"{fmt}|{shape}|{rows}" for (fmt, shape) in layers for rows in sizes]

    def run_one(cell: str) -> float:
        fmt, shape, rows = cell.split("|")
        layer = layers[(fmt, shape)]
        x = inputs[(layer.in_features, int(rows))]
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
