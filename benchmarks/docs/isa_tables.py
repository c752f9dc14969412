"""The forced-instruction-set tables (``benchmarks/isa_compare.py``'s
``benchmarks/results/isa_compare.json``, and ``isa_compare_avx2.json``: the AVX2 targets of
issue 49, run on their own), for ``benchmarks.docs``."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, measured_on

RESULT, RESULT_AVX2 = "isa_compare.json", "isa_compare_avx2.json"


def isa_compare(results: Path) -> list[str]:
    """SmolLM2 bfloat16 per forced instruction set (SPECULANT_CPU_ISA), against llama.cpp built for AVX2 only."""
    return _isa_table(results, RESULT)


def isa_compare_avx2(results: Path) -> list[str]:
    """SmolLM2 bfloat16 under SPECULANT_CPU_ISA=avx2, plain and speculative, against llama.cpp built for AVX2 only."""
    return _isa_table(results, RESULT_AVX2)


def _isa_table(results: Path, result: str) -> list[str]:
    data = _load(results, result)
    if data is None:
        return []
    o, summary = data["options"], data["summary"]
    llama = "llama.cpp/avx2" in summary
    out = [f"SmolLM2-135M-Instruct bfloat16, the 4 edit prompts (chat) × {o['max_tokens']} tokens, greedy, batch 1, "
           f"{o['threads']} threads, prefill included; each row a fresh process with `SPECULANT_CPU_ISA` set (it caps "
           f"torch's ATen, oneDNN and MKL too); speculative rows (`<isa>/<proposer>`) at k = 8; "
           + ("llama.cpp: `llama-bench -p 0 -n 128` (generation only) on a bf16 GGUF, built with "
              "`-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON`, no AVX-512; " if llama else "")
           + f"median of {o['repeats']} alternating rounds (min–max); measured on {measured_on(data)}.", "",
           "| configuration | tok/s | min–max | " + ("vs llama.cpp AVX2 (per round) | " if llama else "")
           + "kernel path | fused decoder | same tokens as avx2/no_spec |",
           "|---|---|---|" + ("---|" if llama else "") + "---|---|---|"]
    same = data.get("same_output_as_avx2_no_spec", {})
    for name, s in summary.items():
        runs = data["runs"][name]
        ratio = s.get("vs_llama_cpp_avx2")
        cells = [name, f"{s['median']:.1f}", f"{s['min']:.1f}–{s['max']:.1f}"]
        if llama:
            cells.append(f"{ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f})" if ratio else "–")
        cells += [str(runs[0].get("kernel_isa", "–")), {True: "yes", False: "no"}.get(runs[0].get("fused"), "–"),
                  {True: "yes", False: "no"}.get(same.get(name), "–")]
        out.append("| " + " | ".join(cells) + " |")
    env = data.get("environment", {})
    if env.get("load_avg") and env.get("load_avg_end"):
        out += ["", f"Load average (1, 5, 15 min) on the 2 cores: {env['load_avg']} at the start, "
                f"{env['load_avg_end']} at the end: other jobs shared the machine, and a row whose range spans "
                "a factor of ten was measured partly while they ran; read its maximum as the unloaded figure."]
    return out


def isa_step_profile(results: Path) -> list[str]:
    """Where a SmolLM2 bfloat16 decode step goes, per forced instruction set (isa_step_profile.py)."""
    data = _load(results, "isa_step_profile.json")
    if data is None:
        return []
    out = [f"The edit prompts one at a time, {data['options']['max_tokens']} tokens, {data['options']['threads']} "
           f"threads; ms per decode step of each prompt, the parts of the fastest prompt's step (the one least "
           f"disturbed by other jobs), the prefill step's ms, and the bf16 linear kernel alone on SmolLM2's shapes "
           f"(30 layers; best of {data['options']['repeats']}); measured on {measured_on(data)}.", "",
           "| path | fused decoder | step, per prompt | fastest: layers + LM head + engine (Python) "
           "| prefill (prompt tokens) | linears alone, 1 row: layers + LM head |",
           "|---|---|---|---|---|---|"]
    for isa, p in data["profiles"].items():
        steps = [q["decode_step_ms"] for q in p["prompts"]]
        best = min(steps, key=lambda s: s["step"])
        prefill = ", ".join(f"{q['prefill_ms']:.0f} ({q['prompt_tokens']})" for q in p["prompts"])
        lin = p["linear_ms_1_row"]
        per_prompt = ", ".join(f"{s['step']:.1f}" for s in steps)
        out.append(f"| {isa} | {'yes' if p['fused'] else 'no'} | {per_prompt} | "
                   f"{best['layers']:.2f} + {best['lm_head']:.2f} + {best['engine']:.2f} | {prefill} | "
                   f"{lin['all layers']:.2f} + {lin['lm_head']:.2f} |")
    return out
