"""Where the time of ``isa_compare.py``'s workload goes, per forced instruction set (issue 49).

SmolLM2-135M-Instruct bfloat16, one request at a time (the chat-rendered edit prompts), greedy,
EOS ignored, 128 new tokens, ``--threads`` threads; each ``--isas`` entry in a fresh process with
``SPECULANT_CPU_ISA`` set before torch loads. Per prompt: the prefill step's wall time, then
per decode step the parts ``fast_forward_bench.StepProfile`` times (metadata, the decoder
layers, the LM head, the engine's Python: schedule, sampling, commit, detokenize). Beside it,
the bfloat16 linear kernel alone on SmolLM2's shapes (q/k/v, o, gate/up, down for 30 layers,
and the LM head) at 1 row and at the prompt's row count, best of ``--repeats``: what the
linears cost inside the layers, the rest of the layers being attention, norms, rotary and silu.
Writes ``results/isa_step_profile.json``.

    python benchmarks/isa_step_profile.py --isas avx2 avx512_bf16
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import harness

CHILD = "--child"
# SmolLM2-135M: hidden 576, 30 layers, 9 query and 3 K/V heads of 64, MLP 1536, vocabulary 49152
LAYER_SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LAYERS, VOCAB, HIDDEN = 30, 49152, 576


def linear_ms(rows: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` ms of the bf16 linear kernel on SmolLM2's shapes for ``rows`` input rows."""
    import torch

    from speculant.model.linear.dot_linear import DotLinear

    out = {}
    for name, (n, k) in {**LAYER_SHAPES, "lm_head": (VOCAB, HIDDEN)}.items():
        layer = DotLinear(torch.randn(n, k).mul_(0.05).bfloat16(), None)
        x = torch.randn(rows, k).bfloat16()
        best = min(harness.time_calls(lambda layer=layer, x=x: layer(x), repeats))
        out[name] = 1e3 * best * (1 if name == "lm_head" else LAYERS)
    out["all layers"] = sum(v for k, v in out.items() if k != "lm_head")
    return {k: round(v, 3) for k, v in out.items()}


def child(max_tokens: int, repeats: int) -> None:
    import fast_forward_bench

    from speculant.bench import load_prompts, render_prompts
    from speculant.bench.speculant_runs import greedy
    from speculant.model.kernels.abi import kernel_isa
    from speculant.model.kernels.build import load_kernel

    llm = harness.smollm2_llm(None, dtype="bfloat16", max_num_seqs=1, quantization="dequantize")
    harness.warm_up(llm, chat=True)
    texts = load_prompts(str(harness.REPO_ROOT / "examples/prompts/edit_tasks.txt"))
    profile = fast_forward_bench.StepProfile(llm)
    prompts = []
    for ids in render_prompts(llm.tokenizer, texts, chat=True):
        eng = llm.engine
        eng.add_request(None, ids, greedy(1))
        start = time.perf_counter()
        while eng.has_unfinished_requests():
            eng.step()
        prefill_ms = 1e3 * (time.perf_counter() - start)
        steps = profile.run(ids, max_tokens)
        prompts.append({"prompt_tokens": len(ids), "prefill_ms": round(prefill_ms, 2), "decode_step_ms": steps})
    rows = max(p["prompt_tokens"] for p in prompts)
    lib = load_kernel()
    print(json.dumps({"kernel_isa": None if lib is None else kernel_isa(lib),
                      "fused": llm.engine.runner.fast_forward.decoder.fused is not None,
                      "fused_reason": llm.engine.runner.fast_forward.decoder.fused_reason, "prompts": prompts,
                      "linear_ms_1_row": linear_ms(1, repeats), f"linear_ms_{rows}_rows": linear_ms(rows, repeats)}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        import speculant  # noqa: F401  (first: it caps torch's instruction set before torch loads)
        harness.pin_threads(int(sys.argv[5]))
        child(int(sys.argv[2]), int(sys.argv[3]))
        return
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "isa_step_profile.json", repeats=20, threads=2)
    ap.add_argument("--isas", nargs="+", default=["avx2", "avx512_bf16"])
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    bench = harness.start("isa_step_profile", args)
    result = {}
    for isa in args.isas:
        env = {**os.environ, "SPECULANT_CPU_ISA": isa, "OMP_NUM_THREADS": str(args.threads)}
        out = subprocess.run([sys.executable, __file__, CHILD, str(args.max_tokens), str(args.repeats), "--threads",
                              str(args.threads)], env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"{isa} failed: {out.stderr[-2000:]}")
        result[isa] = json.loads(out.stdout.strip().splitlines()[-1])
        harness.log(f"{isa}: {json.dumps(result[isa])}")
    bench.write({"profiles": result})


if __name__ == "__main__":
    main()
