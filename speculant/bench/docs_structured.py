"""The structured-output table and headline line (``benchmarks/structured_bench.py``'s
``benchmarks/results/structured_smollm2.json``), for ``speculant.bench.docs``."""

from __future__ import annotations

from pathlib import Path

from speculant.bench.docs_tables import _load, measured_on

RESULT = "structured_smollm2.json"


def structured(results: Path) -> list[str]:
    """Structured output (JSON schemas) on SmolLM2-135M-Instruct (``benchmarks/structured_bench.py``)."""
    data = _load(results, RESULT)
    if data is None:
        return []
    o, out = data["options"], []
    v = data.get("validity")
    if v:
        out += [f"Validity: {v['valid']} of {v['requests']} JSON-schema requests (4 schemas, chat prompts, greedy, "
                f"n-gram k = {o['k']}, {o['concurrency']} at a time, max_tokens {o['validity_max_tokens']}) "
                f"validate against their schema; finish reasons {v['finish_reasons']}.", ""]
    out += [f"Speculation at batch size 1 ({o['prompts']} chat prompts, {o['dtype']}, greedy, k = {o['k']}, "
            f"{o['max_tokens']} tokens at most; free text ignores EOS), on {measured_on(data)}, "
            f"{data.get('machine', 'shared machine')}:", "",
            "| speculation | free text tok/s | speedup | with the schema tok/s | speedup | schema / free speedup "
            "| tokens per step (schema) | output identical to no speculation |",
            "|---|---|---|---|---|---|---|---|"]
    rows = {(r["method"], r["schema"]): r for r in data["speedup"]}
    ratios = data.get("speedup_ratio_schema_vs_free", {})
    for method in dict.fromkeys(r["method"] for r in data["speedup"]):
        free, schema = rows[(method, False)], rows[(method, True)]
        ratio = f"{ratios[method]:.2f}" if method in ratios else "–"
        same = free["outputs_identical_to_none"] and schema["outputs_identical_to_none"]
        out.append(f"| {method} | {free['tokens_per_s']:.1f} | {free['speedup']:.2f}× | {schema['tokens_per_s']:.1f} "
                   f"| {schema['speedup']:.2f}× | {ratio} | {schema['output_tokens'] / schema['steps']:.2f} | "
                   f"{'yes' if same else '**no**'} |")
    m = data["mask_cost"]
    out += ["", f"Mask cost per decode step (no speculation, with the schema; step {m['step_ms']:.1f} ms): "
            f"llguidance's mask computation {100 * m['worker_fraction_of_step']:.1f}% of the step, in a worker "
            f"thread during the forward; on the step's critical path (waiting for it after the forward, then "
            f"applying it) {100 * m['critical_path_fraction_of_step']:.1f}%."]
    return out


def structured_headline(results: Path) -> list[str]:
    data = _load(results, RESULT)
    if data is None:
        return []
    v = data.get("validity") or {}
    ratios = ", ".join(f"{k} {x:.2f}" for k, x in data.get("speedup_ratio_schema_vs_free", {}).items())
    valid = f"{v['valid']}/{v['requests']} outputs valid; " if v else ""
    return [f"| structured output (JSON schema), SmolLM2: validity, speedup under the schema / without | "
            f"{valid}{ratios}; mask on the critical path "
            f"{100 * data['mask_cost']['critical_path_fraction_of_step']:.1f}% of a step | {measured_on(data)} | "
            f"[structured](docs/benchmarks.md#results-structured) |"]
