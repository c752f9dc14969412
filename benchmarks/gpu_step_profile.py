"""Where a batch-1 decode step's time goes on a GPU: the whole step, the model
forward inside it, and the kernels one forward launches (torch.profiler).

    python benchmarks/gpu_step_profile.py --target FILE.gguf|DIR [--out F.json]
"""

from __future__ import annotations

import json
import time

import torch

import harness
from speculant import LLM, SamplingParams


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "gpu_step_profile_smollm2.json", dtype="bfloat16")
    ap.add_argument("--target", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args()
    bench = harness.start("gpu_step_profile", args)
    llm = LLM(model=args.target, dtype=args.dtype, device="cuda", attention_backend=args.backend)
    eng, runner = llm.engine, llm.engine.runner
    forward_s: list[float] = []
    inner = runner.forward

    def timed_forward(*a, **k):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = inner(*a, **k)
        torch.cuda.synchronize()
        forward_s.append(time.perf_counter() - t)
        return out

    runner.forward = timed_forward
    eng.add_request(None, list(range(100, 400)), SamplingParams(temperature=0, max_tokens=args.steps + 40,
                                                                ignore_eos=True))
    for _ in range(10):
        eng.step()
    forward_s.clear()
    steps = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        eng.step()
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - t)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        eng.step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel")))
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    med = sorted(steps)[len(steps) // 2]
    fwd = sorted(forward_s)[len(forward_s) // 2]
    result = {"target": args.target, "dtype": args.dtype,
              "attention_backend": type(runner.backend).__name__,
              "step_ms_median": med * 1e3, "forward_ms_median": fwd * 1e3,
              "outside_forward_ms": (med - fwd) * 1e3, "kernel_launches_per_step": launches,
              "gpu_busy_ms_per_step": gpu_us / 1e3,
              "top_cpu_ops": [(e.key, round(e.cpu_time_total / 1e3, 2), e.count)
                              for e in sorted(events, key=lambda e: -e.cpu_time_total)[:12]]}
    print(json.dumps(result, indent=1))
    bench.write(result)


if __name__ == "__main__":
    main()
