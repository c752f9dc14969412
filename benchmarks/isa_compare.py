"""SmolLM2 bfloat16 per forced instruction set, against llama.cpp bf16 built for AVX2 only (issue 49).

SmolLM2 is the wheel's Q4_1 GGUF dequantized to bfloat16 (``model.quantization = "dequantize"``: kept
quantized, the default since issue 51, it would run the quantized kernels instead of the bf16 ones).

Workload: the 4 chat-rendered prompts of ``examples/prompts/edit_tasks.txt``, one request at a
time (bs = 1), greedy, EOS ignored, 128 new tokens, prefill included, ``--threads`` threads.
Each configuration runs in its own process with ``SPECULANT_CPU_ISA`` set before torch loads
(the cap reaches torch's ATen, oneDNN and MKL too); model load and one warm-up request are not
timed; each run records a digest of its output tokens (greedy: speculation must not change them,
nor may the instruction set: ``same_output_as_avx2_no_spec`` in the JSON). Rows: ``<isa>/no_spec`` for
each ``--isas``, and ``avx2/<proposer>`` for each ``--spec`` proposer (suffix, ngram; k = 8).
``llama.cpp/avx2``: ``llama-bench -p 0 -n 128`` on ``--llama-gguf`` with ``--llama-bench`` (a build
with ``-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON``,
no AVX-512): pure generation, no prefill, so it flatters llama.cpp slightly. Every configuration
runs once per round, the order alternating (harness.rounds). Writes ``results/isa_compare.json``.

    python benchmarks/isa_compare.py --llama-bench /work/llama-avx2-build/bin/llama-bench \\
        --llama-gguf /tmp/smollm2-bf16.gguf --repeats 5
    # the AVX2 targets alone (a shorter run: no scalar row), into results/isa_compare_avx2.json
    python benchmarks/isa_compare.py --isas avx2 --spec suffix ngram --out benchmarks/results/isa_compare_avx2.json \\
        --llama-bench /work/llama-avx2-build/bin/llama-bench --llama-gguf /tmp/smollm2-bf16.gguf --repeats 5
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import harness

CHILD = "--child"


def child(isa: str, method: str, max_tokens: int) -> None:
    """In a fresh process (SPECULANT_CPU_ISA already set): tok/s of the workload on one engine."""
    from speculant import SamplingParams
    from speculant.bench import load_prompts
    from speculant.model.kernels.abi import kernel_isa
    from speculant.model.kernels.build import load_kernel

    spec = None if method == "no_spec" else {"proposer": method}
    llm = harness.smollm2_llm(spec, k=8 if spec else None, dtype="bfloat16", max_num_seqs=1,
                              quantization="dequantize")
    harness.warm_up(llm, chat=True)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    tokens, t0, digest = 0, time.perf_counter(), hashlib.sha256()
    for text in load_prompts(str(harness.REPO_ROOT / "examples/prompts/edit_tasks.txt")):
        out = llm.chat([{"role": "user", "content": text}], params, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in out)
        digest.update(json.dumps([list(o.outputs[0].token_ids) for o in out]).encode())
    wall = time.perf_counter() - t0
    lib = load_kernel()
    print(json.dumps({"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall, "isa_requested": isa,
                      "output_sha256": digest.hexdigest(),
                      "kernel_isa": None if lib is None else kernel_isa(lib),
                      "fused": llm.engine.runner.fast_forward.decoder.fused is not None}))


def run_speculant(name: str, args) -> dict:
    isa, method = name.split("/")
    env = {**os.environ, "SPECULANT_CPU_ISA": isa, "OMP_NUM_THREADS": str(args.threads)}
    out = subprocess.run([sys.executable, __file__, CHILD, isa, method, str(args.max_tokens),
                          "--threads", str(args.threads)], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_llama(args) -> dict:
    out = subprocess.run([args.llama_bench, "-m", args.llama_gguf, "-p", "0", "-n", str(args.max_tokens), "-t",
                          str(args.threads), "-r", "1", "-o", "json"], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {out.stderr[-2000:]}")
    row = json.loads(out.stdout)[0]
    return {"tok_s": row["avg_ts"], "tokens": row["n_gen"], "build": row.get("cpu_info", ""),
            "backend": row.get("backends", "")}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        isa, method, max_tokens = sys.argv[2], sys.argv[3], int(sys.argv[4])
        import speculant  # noqa: F401  (first: it caps torch's instruction set before torch loads)
        harness.pin_threads(int(sys.argv[6]))
        child(isa, method, max_tokens)
        return
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "isa_compare.json", repeats=5, threads=2)
    ap.add_argument("--isas", nargs="+", default=["scalar", "avx2", "avx512", "avx512_bf16"])
    ap.add_argument("--spec", nargs="*", default=["suffix"], help="proposers measured on avx2 (k = 8)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--llama-gguf", default=None)
    args = ap.parse_args()
    bench = harness.start("isa_compare", args)
    names = [f"{isa}/no_spec" for isa in args.isas] + [f"avx2/{p}" for p in args.spec]
    if args.llama_bench and args.llama_gguf:
        names.append("llama.cpp/avx2")
    runs = harness.rounds(names, args.repeats,
                          lambda n: run_llama(args) if n.startswith("llama.cpp") else run_speculant(n, args),
                          describe=lambda r: f"{r['tok_s']:.1f} tok/s")
    tok_s = harness.medians(runs, "tok_s")
    outputs = {n: {r.get("output_sha256") for r in runs[n]} for n in names if not n.startswith("llama.cpp")}
    summary = {n: {**harness.summary([r["tok_s"] for r in runs[n]], 2)} for n in names}
    if "llama.cpp/avx2" in runs:
        for n in names:
            summary[n]["vs_llama_cpp_avx2"] = harness.summary(harness.per_round_ratios(runs, n, "llama.cpp/avx2",
                                                                                       "tok_s"), 3)
    bench.log(harness.markdown_table(["config", "tok/s (median)", "min", "max"],
                                     [[n, f"{tok_s[n]:.1f}", f"{summary[n]['min']:.1f}", f"{summary[n]['max']:.1f}"]
                                      for n in names]))
    bench.write({"summary": summary, "runs": runs, "same_output_as_avx2_no_spec": {
        n: outputs[n] == outputs.get("avx2/no_spec") for n in outputs}})


if __name__ == "__main__":
    main()
