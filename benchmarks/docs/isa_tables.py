"""The forced-instruction-set table (``benchmarks/isa_compare.py``'s
``benchmarks/results/isa_compare.json``), for ``benchmarks.docs``."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, measured_on

RESULT = "isa_compare.json"


def isa_compare(results: Path) -> list[str]:
    """SmolLM2 bfloat16 per forced instruction set (SPECULANT_CPU_ISA), against llama.cpp built for AVX2 only."""
    data = _load(results, RESULT)
    if data is None:
        return []
    o, summary = data["options"], data["summary"]
    llama = "llama.cpp/avx2" in summary
    out = [f"SmolLM2-135M-Instruct bfloat16, the 4 edit prompts (chat) × {o['max_tokens']} tokens, greedy, batch 1, "
           f"{o['threads']} threads, prefill included; each row a fresh process with `SPECULANT_CPU_ISA` set (it caps "
           f"torch's ATen, oneDNN and MKL too); suffix decoding at k = 8; "
           + ("llama.cpp: `llama-bench -p 0 -n 128` (generation only) on a bf16 GGUF, built with "
              "`-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON`, no AVX-512; " if llama else "")
           + f"median of {o['repeats']} alternating rounds (min–max); measured on {measured_on(data)}.", "",
           "| configuration | tok/s | min–max | " + ("vs llama.cpp AVX2 (per round) | " if llama else "")
           + "kernel path | fused decoder |",
           "|---|---|---|" + ("---|" if llama else "") + "---|---|"]
    for name, s in summary.items():
        runs = data["runs"][name]
        ratio = s.get("vs_llama_cpp_avx2")
        cells = [name, f"{s['median']:.1f}", f"{s['min']:.1f}–{s['max']:.1f}"]
        if llama:
            cells.append(f"{ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f})" if ratio else "–")
        cells += [str(runs[0].get("kernel_isa", "–")), {True: "yes", False: "no"}.get(runs[0].get("fused"), "–")]
        out.append("| " + " | ".join(cells) + " |")
    env = data.get("environment", {})
    if env.get("load_avg") and env.get("load_avg_end"):
        out += ["", f"Load average (1, 5, 15 min) on the 2 cores: {env['load_avg']} at the start, "
                f"{env['load_avg_end']} at the end: other jobs shared the machine, and a row whose range spans "
                "a factor of ten was measured partly while they ran; read its maximum as the unloaded figure."]
    return out
