"""Where a step's time goes on a real-size GGUF kept quantized (issue 51): a batch-1 decode, a step of
32 decodes over 32 different lengths, and a 512-token prefill chunk.

Each step is timed through ``ModelRunner.forward`` (what the engine runs, the fused decoder included),
then its parts are timed on their own with the step's shapes: every quantized linear layer but the
output layer (``quant GEMM``) and the output layer on the rows that need logits. ``rest`` is the step
less those parts. It is not a cost of its own: each part is timed by repeating one matrix, which then
sits in cache, while the step streams every matrix from memory (benchmarks/README.md has the perf
breakdown: at batch 1 the non-GEMM work is a few percent). Median of ``--repeats`` calls each.
"""

from __future__ import annotations

from typing import Any

import torch
from selftest_check import model_path

import harness

WORKLOADS = {"decode_1": (1, 120, 1), "decode_32": (32, 0, 1), "prefill_512": (1, 0, 512)}
"""name -> (requests, context tokens each (0: 60 + 8 i for request i), new tokens each)."""


def spans_of(runner, name: str) -> list[Any]:
    from speculant.interfaces.span_tensors import PagedSpan

    n, ctx, new = WORKLOADS[name]
    lengths = [(ctx or 60 + 8 * i) for i in range(n)]
    tables = runner.scratch_tables([c + new for c in lengths])
    gen = torch.Generator().manual_seed(0)
    spans = []
    for table, c in zip(tables, lengths):
        ids = torch.randint(0, runner.vocab_size, (c + new,), generator=gen).tolist()
        if c:  # fill the context's K/V first
            runner.forward([PagedSpan(table, 0, ids[:c], [c - 1])])
        spans.append(PagedSpan(table, c, ids[c:], [new - 1]))
    return spans


def profile(runner, name: str, repeats: int) -> dict[str, float]:
    from speculant.model.linear.quantized import QuantLinear

    spans = spans_of(runner, name)
    tokens = sum(s.num_tokens for s in spans)
    step = harness.median(harness.time_calls(lambda: runner.forward(spans), repeats))
    head = runner.model.get_output_embeddings()
    dtype = runner.model.dtype
    gemm = 0.0
    with torch.inference_mode():
        for module in runner.model.modules():
            if isinstance(module, QuantLinear) and module is not head:
                x = torch.randn(tokens, module.in_features).to(dtype)
                gemm += harness.median(harness.time_calls(lambda m=module, x=x: m(x), repeats))
        x = torch.randn(len(spans), head.in_features).to(dtype)
        out = harness.median(harness.time_calls(lambda: head(x), repeats))
    return {"tokens": tokens, "step_ms": 1e3 * step, "quant_gemm_ms": 1e3 * gemm, "output_layer_ms": 1e3 * out,
            "rest_ms": 1e3 * (step - gemm - out)}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "quant_step_profile.json", repeats=5, threads=2)
    ap.add_argument("--model", default="qwen-1.5b-q4km", help="a fetch_gguf_parts name or a .gguf path")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    bench = harness.start("quant_step_profile", args)
    from speculant import LLM

    llm = LLM(model=model_path(args.model), max_num_seqs=32, enable_prefix_caching=False)
    runner = llm.engine.runner
    rows = {}
    for name in args.workloads.split(","):
        rows[name] = {k: round(v, 3) for k, v in profile(runner, name, args.repeats).items()}
        r = rows[name]
        bench.log(f"{name}: step {r['step_ms']:.1f} ms = quant GEMM {r['quant_gemm_ms']:.1f} + output layer "
                  f"{r['output_layer_ms']:.1f} + rest {r['rest_ms']:.1f} ({r['tokens']} tokens)")
    bench.write({"model": args.model, "fast_forward": runner.fast_forward.describe(), "rows": rows})


if __name__ == "__main__":
    main()
