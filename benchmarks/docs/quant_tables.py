"""The docs tables of issue 51: Qwen2.5-Coder-1.5B-Instruct Q4_K_M kept quantized
(``model.quantization = "gguf"``) against its bf16 conversion and llama.cpp on the
same file: t(n)/t(1) of a forward of n query rows, and the decode rate."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, _num, _x, measured_on

BF16 = "verify_rows_qwen15b_bf16.json"
Q4K = "verify_rows_qwen15b_q4k.json"
LLAMACPP = "quant_decode_qwen15b_q4km.json"
KERNEL = "quant_kernel_rows.json"
KERNEL_B32 = "quant_kernel_rows_b32.json"
"""The blocks of 32 (the 0.5B draft's Q5_0 and Q8_0, SmolLM2's Q4_1) in the file's layout and repacked."""


def quant_1p5b(results: Path) -> list[str]:
    """Qwen2.5-Coder-1.5B Q4_K_M: t(n)/t(1) and decode, ours (quantized and bf16) and llama.cpp's"""
    bf16, q4k, cmp = _load(results, BF16), _load(results, Q4K), _load(results, LLAMACPP)
    if q4k is None and cmp is None:
        return []
    out = []
    columns = [(name, data, {r["rows"]: r for r in data["rows"]}) for name, data in
               (("Speculant bf16 (dequantized)", bf16), ("Speculant Q4_K (quantized kernels)", q4k)) if data]
    if q4k is None and cmp and cmp.get("ours_rows"):
        columns.append(("Speculant Q4_K (quantized kernels)", cmp, {r["rows"]: r for r in cmp["ours_rows"]}))
    if cmp and cmp.get("llamacpp_prompt_rows"):
        theirs_pp = {r["rows"]: r for r in cmp["llamacpp_prompt_rows"]}
        columns.append(("llama.cpp Q4_K_M (llama-bench -p n)", cmp, theirs_pp))
    sizes = sorted(set().union(*(rows.keys() for _, _, rows in columns))) if columns else []
    if columns:
        out += ["A forward of n query rows against one, t(n)/t(1), median ms (ratio: median of the per-round "
                "ratios for ours, of the medians for llama.cpp):", "",
                "| n | " + " | ".join(name for name, _, _ in columns) + " |", "|---|" + "---|" * len(columns)]
        for n in sizes:
            cells = []
            for _, _, rows in columns:
                r = rows.get(n)
                cells.append("–" if r is None else f"{1e3 * r['median_s']:.1f} ms ({_x(r.get('ratio_to_1'))})")
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
        for name, data, _ in columns:
            ctx = data.get("ctx", data.get("depth"))
            out.append(f"- {name}: {ctx} tokens in the context, {data['options'].get('threads')} threads, "
                       f"{data['options'].get('repeats')} rounds; measured on {measured_on(data)}.")
    if cmp:
        rows = {r["engine"]: r for r in cmp["rows"]}
        ours, theirs = rows["speculant"], rows["llama.cpp"]
        out += ["", f"Decode at depth {cmp['depth']}, {cmp['gen']} tokens, bs = 1, "
                    f"{cmp['options'].get('threads')} threads, median (min-max) of {cmp['options'].get('repeats')} "
                    f"alternating rounds; measured on {measured_on(cmp)} (a machine shared with other jobs):", "",
                "| engine | tok/s | min | max |", "|---|---|---|---|",
                f"| Speculant, Q4_K_M kept quantized | {_num(ours['tok_s'], 2)} | {_num(ours['min'], 2)} | "
                f"{_num(ours['max'], 2)} |",
                f"| llama.cpp llama-bench tg | {_num(theirs['tok_s'], 2)} | {_num(theirs['min'], 2)} | "
                f"{_num(theirs['max'], 2)} |", "",
                f"Ours / llama.cpp, per round: {_x(cmp['ratio_median'])} ({_x(cmp['ratio_min'])}-"
                f"{_x(cmp['ratio_max'])}). Layers: {cmp.get('quantized_layers')}; forward path: "
                f"{cmp.get('forward_path')}."]
    return out + kernel_rows(results) + kernel_rows(results, KERNEL_B32)


def kernel_rows(results: Path, name: str = KERNEL) -> list[str]:
    """The quantized kernel alone: t(n)/t(1) of one call of n rows, per format (``_X16``: repacked) and shape."""
    data = _load(results, name)
    if data is None:
        return []
    cells = {(r["format"], r["shape"], r["rows"]): r for r in data["rows"]}
    columns = sorted({(f, s) for f, s, _ in cells}, key=lambda c: (c[0], c[1]))
    sizes = sorted({n for _, _, n in cells})
    out = ["", f"The quantized kernel alone (`quant_kernel_rows.py`, path {data.get('isa')}, "
               f"{data['options'].get('threads')} threads, fastest of {data['options'].get('calls')} calls, median "
               f"of {data['options'].get('repeats')} alternating rounds; measured on {measured_on(data)}): ms "
               "(t(n)/t(1))", "",
           "| n | " + " | ".join(f"{f} {s}" for f, s in columns) + " |", "|---|" + "---|" * len(columns)]
    for n in sizes:
        row = [cells.get((f, s, n)) for f, s in columns]
        out.append(f"| {n} | " + " | ".join("–" if r is None else f"{1e3 * r['median_s']:.3f} ({_x(r['ratio_to_1'])})"
                                            for r in row) + " |")
    return out
