"""Speculant's own bf16 CPU kernels, switched on one by one, on SmolLM2-135M (issue 29).

The workload of ``llamacpp_compare.py`` (the chat-rendered prompts of
``examples/prompts/edit_tasks.txt``, one request at a time, greedy, EOS
ignored, 128 new tokens, prefill included), bf16, the fast decoder on, rows
without speculation and with suffix at k = 8, each under three kernel sets:

* ``onednn``: the linears packed for oneDNN, norms and rotary as torch
  operators (what ran before these kernels);
* ``dot``: the linears on ``csrc/linear_bf16.c`` (``linear_backend =
  "avx512_bf16"``, with the residual add fused), norms and rotary as before;
* ``all``: the dot-product linears plus the C RMSNorm, rotary and silu, called
  operator by operator from the fast decoder's Python loop;
* ``fused``: the default: the same kernels, every layer of a decode or verify
  forward in one C call (``csrc/decoder_bf16.c``, ``fast_forward/fused_layers.py``).

All rows load in one process and run interleaved round by round; every row's
tokens must equal the ``onednn`` row's (the kernels round as the operators
they replace; the linears' float32 sums may differ in order, so bf16 may
part at a near-tie: the JSON says whether they did). A per-step profile of
the no-speculation rows follows. Writes ``results/cpu_kernels_smollm2.json``.

    python benchmarks/cpu_kernels_bench.py          # ~4 minutes on 2 cores; needs AVX512-BF16
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from fast_forward_bench import StepProfile, chat_ids

import harness

KERNEL_SETS = ("onednn", "dot", "all", "fused")
METHODS = ("no_spec", "suffix")


@contextlib.contextmanager
def torch_norms_and_rotary() -> Iterator[None]:
    """Load with the norms and rotary as torch operators (the C forms withheld)."""
    from speculant.model import fused_norms
    from speculant.model.fast_forward import decoder

    saved = fused_norms._c_kernel_form, decoder.rotary_call
    fused_norms._c_kernel_form = lambda lanes: None  # type: ignore[assignment]
    decoder.rotary_call = lambda like: decoder._rotate_torch  # type: ignore[assignment]
    try:
        yield
    finally:
        fused_norms._c_kernel_form, decoder.rotary_call = saved


def build(target: str, kernels: str, method: str, k: int):
    from speculant.bench.speculant_runs import Method, build_llm
    from speculant.model.loading.gguf_source import resolve_model_source

    model_dir = resolve_model_source(target, None, "bfloat16", option="--target")
    spec = {"proposer": method, "num_speculative_tokens": k} if method != "no_spec" else None
    backend = {"onednn": "onednn", "dot": "avx512_bf16", "all": "auto", "fused": "auto"}[kernels]
    context = contextlib.nullcontext() if kernels in ("all", "fused") else torch_norms_and_rotary()
    with context:
        llm = build_llm(str(model_dir), Method(method, spec), 1, "bfloat16", "cpu", fast_forward="on",
                        linear_backend=backend)
    decoder = llm.engine.runner.fast_forward.decoder
    if kernels == "fused" and decoder.fused is None:
        raise SystemExit(f"the fused layers do not run here: {decoder.fused_reason}")
    if kernels != "fused":
        decoder.fused = None  # the per-operator loop
    return llm


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "cpu_kernels_smollm2.json", repeats=2, threads=2,
                            quick="16 new tokens, one round, two prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()
    bench = harness.start("cpu_kernels_smollm2", args)
    from speculant.bench import load_prompts
    from speculant.bench.speculant_runs import run_method

    texts = load_prompts("examples/prompts/edit_tasks.txt")
    max_tokens, repeats = (16, 1) if args.quick else (args.max_tokens, args.repeats)
    texts = texts[:2] if args.quick else texts
    target = harness.smollm2_path()
    names = [f"{m} {ks}" for m in METHODS for ks in KERNEL_SETS]
    llms, loads = {}, {}
    for name in names:
        method, kernels = name.split()
        bench.log(f"loading {name} ...")
        start = time.perf_counter()
        llms[name] = build(target, kernels, method, args.k)
        loads[name] = time.perf_counter() - start
    prompts = chat_ids(llms[names[0]], texts)
    runs = harness.rounds(names, repeats, lambda n: run_method(llms[n], prompts, max_tokens, 1, 1),
                          lambda r: f"{r['tokens_per_s']:.1f} tok/s")
    rows: list[dict[str, Any]] = []
    for name in names:
        method, kernels = name.split()
        base = f"{method} onednn"
        rate = harness.median([r["tokens_per_s"] for r in runs[name]])
        base_rate = harness.median([r["tokens_per_s"] for r in runs[base]])
        rows.append({"row": name, "method": method, "kernels": kernels,
                     "linear_backend": llms[name].engine.runner.linear_report.backend,
                     "tokens_per_s": round(rate, 2),
                     "tokens_per_s_samples": [round(r["tokens_per_s"], 2) for r in runs[name]],
                     "vs_onednn": round(rate / base_rate, 3),
                     "mean_accepted_length": runs[name][-1]["mean_accepted_length"],
                     "same_tokens_as_onednn": runs[name][-1]["token_ids"] == runs[base][-1]["token_ids"],
                     "load_s": round(loads[name], 2)})
        print(f"{name:<16} {rate:7.1f} tok/s  {rate / base_rate:.2f}x onednn  "
              f"same tokens: {rows[-1]['same_tokens_as_onednn']}")
    profile = {}
    for name in (f"no_spec {ks}" for ks in KERNEL_SETS):
        profile[name] = StepProfile(llms[name]).run(prompts[0], max_tokens)
        print(name, profile[name])
    bench.write({"workload": {"prompts": "examples/prompts/edit_tasks.txt (chat)", "max_tokens": max_tokens,
                              "k": args.k, "batch": 1, "greedy": True, "ignore_eos": True, "dtype": "bfloat16",
                              "fast_forward": "on"},
                 "rows": rows, "step_profile_ms": profile,
                 "step_profile_note": "ms per decode step, one prompt, wall clock (fast_forward_bench.StepProfile)"})


if __name__ == "__main__":
    main()
