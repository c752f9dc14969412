"""GPU check of the ``triton`` attention backend: accuracy against the torch
reference backend on real sizes, and milliseconds per call of both.

    python -m speculant.model.attention.triton_check --json triton_check.json

Accuracy: each case is one mixed batch (prefill chunks over long cached
prefixes, fresh prefills, decodes, verify runs, batch-expansion siblings) in
a garbage-filled pool with shuffled block tables; the reference is the torch
backend in float64 over the same stored values. It prints the largest error
and the largest error in units in the last place of the exact value (the
kernel computes float32 and rounds once: about half an ulp in 16-bit dtypes,
a little more where the tf32 product of the probabilities with V rounds them
to 10 bits), checks that the caches hold exactly the new K/V, and that
``build_metadata`` + ``forward`` ran without a host synchronisation
(``torch.cuda.set_sync_debug_mode("error")``).

Speed: median milliseconds per layer call (K/V write + attention) of the
triton backend and of the torch reference backend, on decode, verify,
prefill and mixed batches with Llama-sized heads; CUDA events, after warm-up
(the first call's compile time is reported on its own).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from speculant.interfaces import AttentionBackend
from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model.attention.torch_ref import TorchAttentionBackend
from speculant.model.attention.triton_backend import TritonAttentionBackend

# a span of a sequence: (context before the span, query tokens); siblings: ("siblings", context, count)
Span = tuple[int, int]


@dataclass(frozen=True)
class Case:
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    spans: list[Span] = field(default_factory=list)  # one sequence per span
    siblings: tuple[int, int] | None = None  # (sequence length, single-token spans at its end)


MIXED = [(1000, 300), (0, 700), (3000, 1), (2000, 4), (2500, 1), (64, 1), (1500, 8)]
ACCURACY = [
    Case("llama3-8b-like bf16", 32, 8, 128, 16, "bfloat16", MIXED, (1200, 3)),
    Case("mha d64 fp16", 32, 32, 64, 16, "float16", MIXED, (900, 2)),
    Case("gqa fp32", 32, 4, 128, 16, "float32", MIXED, (700, 3)),
    Case("mqa d64 bf16 block32", 32, 1, 64, 32, "bfloat16", MIXED, None),
    Case("d80 block5 fp16", 32, 32, 80, 5, "float16", [(600, 40), (1000, 1), (0, 33), (777, 5)], (300, 3)),
    Case("group7 d128 bf16 block1", 28, 4, 128, 1, "bfloat16", [(500, 20), (900, 1), (0, 17), (300, 4)], None),
    Case("d256 bf16", 16, 8, 256, 16, "bfloat16", [(1200, 64), (2000, 1), (100, 3)], None),
    Case("long decode batch bf16", 32, 8, 128, 16, "bfloat16", [(4000 - 37 * i, 1) for i in range(32)], None),
]
SPEED = [
    Case("decode 32 x 2k", 32, 8, 128, 16, "bfloat16", [(2048, 1)] * 32),
    Case("decode 8 x 4k", 32, 8, 128, 16, "bfloat16", [(4096, 1)] * 8),
    Case("verify 16 x (k+1=4) over 2k", 32, 8, 128, 16, "bfloat16", [(2048, 4)] * 16),
    Case("prefill chunk 512 over 1.5k", 32, 8, 128, 16, "bfloat16", [(1536, 512)]),
    Case("fresh prefill 2k", 32, 8, 128, 16, "bfloat16", [(0, 2048)]),
    Case("mixed: chunk 256 + 24 decodes + 8 verify runs", 32, 8, 128, 16, "bfloat16",
         [(1024, 256)] + [(1500, 1)] * 24 + [(1800, 4)] * 8),
    Case("decode 32 x 2k mha d64 fp16", 32, 32, 64, 16, "float16", [(2048, 1)] * 32),
]


def build(case: Case, device: torch.device, seed: int = 0):
    """(SpanTensors, q [T, H, D], k/v [T, H_kv, D], key/value caches) for ``case``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype, bs = getattr(torch, case.dtype), case.block_size
    seqs: list[tuple[int, list[tuple[int, int]]]] = [(c + q, [(c, c + q)]) for c, q in case.spans]
    if case.siblings is not None:
        length, count = case.siblings
        seqs.append((length, [(p, p + 1) for p in reversed(range(length - count, length))]))
    needed = [-(-n // bs) for n, _ in seqs]
    num_blocks = sum(needed) + 4
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [order[sum(needed[:i]): sum(needed[: i + 1])] for i in range(len(seqs))]
    shape = (num_blocks, bs, case.kv_heads, case.head_dim)
    key_cache = (10 * torch.randn(shape, generator=gen)).to(dtype).to(device)
    value_cache = (10 * torch.randn(shape, generator=gen)).to(dtype).to(device)
    spans, qs, ks, vs = [], [], [], []
    for (length, seq_spans), table in zip(seqs, tables):
        k = torch.randn(length, case.kv_heads, case.head_dim, generator=gen).to(dtype).to(device)
        v = torch.randn(length, case.kv_heads, case.head_dim, generator=gen).to(dtype).to(device)
        q = torch.randn(length, case.heads, case.head_dim, generator=gen).to(dtype).to(device)
        prefix = min(s for s, _ in seq_spans)
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(prefix)], device=device, dtype=torch.long)
        key_cache.view(-1, case.kv_heads, case.head_dim)[slots] = k[:prefix]
        value_cache.view(-1, case.kv_heads, case.head_dim)[slots] = v[:prefix]
        for start, end in seq_spans:
            spans.append(PagedSpan(list(table), start, [0] * (end - start), []))
            qs.append(q[start:end])
            ks.append(k[start:end])
            vs.append(v[start:end])
    st = SpanTensors.build(spans, bs, device)
    return st, torch.cat(qs), torch.cat(ks), torch.cat(vs), key_cache, value_cache


def check_accuracy(case: Case, device: torch.device) -> dict:
    st, q, k, v, key_cache, value_cache = build(case, device)
    ref_k, ref_v = key_cache.double(), value_cache.double()
    scale = case.head_dim ** -0.5
    backend = TritonAttentionBackend()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host read in build_metadata/forward raises
    try:
        out = backend.forward(q, k, v, key_cache, value_cache, backend.build_metadata(st), scale)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = TorchAttentionBackend()
    want = ref.forward(q.double(), k.double(), v.double(), ref_k, ref_v, ref.build_metadata(st), scale)
    err = (out.double() - want).abs()
    eps = torch.finfo(out.dtype).eps
    ulps = err / (eps * want.abs().clamp_min(1e-3))
    return {**asdict(case), "tokens": q.shape[0], "max_abs_error": err.max().item(),
            "max_error_ulps": ulps.max().item(), "mean_error_ulps": ulps.mean().item(),
            "caches_exact": bool(torch.equal(key_cache, ref_k.to(key_cache.dtype))
                                 and torch.equal(value_cache, ref_v.to(value_cache.dtype)))}


def time_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` calls (CUDA events, after two warm-up calls)."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_speed(case: Case, device: torch.device, repeats: int) -> dict:
    st, q, k, v, key_cache, value_cache = build(case, device)
    scale = case.head_dim ** -0.5
    row: dict = {**asdict(case), "tokens": q.shape[0]}
    backends: list[AttentionBackend] = [TritonAttentionBackend(), TorchAttentionBackend()]
    for backend in backends:
        meta = backend.build_metadata(st)
        t0 = time.perf_counter()
        backend.forward(q, k, v, key_cache, value_cache, meta, scale)
        torch.cuda.synchronize()
        row[f"{backend.name}_first_call_s"] = time.perf_counter() - t0
        row[f"{backend.name}_ms"] = time_ms(
            functools.partial(backend.forward, q, k, v, key_cache, value_cache, meta, scale), repeats)
    row["speedup_vs_torch"] = row["torch_ms"] / row["triton_ms"]
    return row


MAX_ULPS = 2.0
"""A case fails above this error (in units in the last place of the storage dtype):
half an ulp is the rounding of one exact result; "tf32" products of the 16-bit
probabilities with V may add a little (see triton_kernels)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per case and backend")
    parser.add_argument("--skip-speed", action="store_true", help="accuracy only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device: this check runs the compiled kernels on a GPU (the CPU tests run them "
                     "under TRITON_INTERPRET=1: tests/model/attention/test_triton_attention.py)")
    device = torch.device("cuda")
    import triton

    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "triton": triton.__version__, "accuracy": [], "speed": []}
    for case in ACCURACY:
        row = check_accuracy(case, device)
        results["accuracy"].append(row)
        print(f"accuracy {case.name:28s} T={row['tokens']:5d} max|err|={row['max_abs_error']:.3e} "
              f"max ulps={row['max_error_ulps']:.2f} mean ulps={row['mean_error_ulps']:.3f} "
              f"caches exact={row['caches_exact']}", flush=True)
    for case in [] if args.skip_speed else SPEED:
        row = measure_speed(case, device, args.repeats)
        results["speed"].append(row)
        print(f"speed {case.name:48s} T={row['tokens']:5d} triton {row['triton_ms']:.3f} ms  torch "
              f"{row['torch_ms']:.3f} ms  x{row['speedup_vs_torch']:.1f} (first call {row['triton_first_call_s']:.1f}"
              " s)", flush=True)
    bad = [r["name"] for r in results["accuracy"] if not r["caches_exact"] or r["max_error_ulps"] > MAX_ULPS]
    results["accuracy_failures"] = bad
    args.json.write_text(json.dumps(results, indent=2))
    print(f"accuracy: {len(results['accuracy']) - len(bad)} of {len(results['accuracy'])} cases within "
          f"{MAX_ULPS} ulps with exact caches" + (f"; FAILED: {', '.join(bad)}" if bad else ""), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
