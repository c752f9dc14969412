"""The structured-output table and headline line (``benchmarks/structured_bench.py``'s
``benchmarks/results/structured_smollm2.json``), for ``benchmarks.docs``."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, measured_on

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
                f"validate against their schema; finish reasons {v['finish_reasons']}"
                f"{' (run ' + str(v['utc']).replace('T', ' ') + ' UTC)' if v.get('utc') else ''}.", ""]
    out += [f"Speculation at batch size 1 ({o['prompts']} chat prompts, {o['dtype']}, greedy, k = {o['k']}, "
            f"{o['max_tokens']} tokens at most; free text ignores EOS; median of {o.get('repeats', 1)} interleaved "
            f"rounds by the process's CPU time, the clock other jobs disturb least), on {measured_on(data)}, "
            f"{data.get('machine', 'shared machine')}:", "",
            "| speculation | free text tok/CPU-s | speedup | with the schema tok/CPU-s | speedup | schema / free "
            "speedup | tokens per step, free / schema | output identical to no speculation |",
            "|---|---|---|---|---|---|---|---|"]
    rows = {(r["method"], r["schema"]): r for r in data["speedup"]}
    ratios = data.get("speedup_ratio_schema_vs_free", {})
    for method in dict.fromkeys(r["method"] for r in data["speedup"]):
        free, schema = rows[(method, False)], rows[(method, True)]
        ratio = f"{ratios[method]:.2f}" if method in ratios else "–"
        same = free["outputs_identical_to_none"] and schema["outputs_identical_to_none"]
        rate = "tokens_per_cpu_s" if "tokens_per_cpu_s" in free else "tokens_per_s"
        out.append(f"| {method} | {free[rate]:.1f} | {free['speedup']:.2f}× | {schema[rate]:.1f} "
                   f"| {schema['speedup']:.2f}× | {ratio} | {free['output_tokens'] / free['steps']:.2f} / "
                   f"{schema['output_tokens'] / schema['steps']:.2f} | {'yes' if same else '**no**'} |")
    m = data["mask_cost"]
    out += ["", f"Mask cost per decode step (no speculation, with the schema; median over rounds; a step takes "
            f"{m['step_cpu_ms']:.1f} ms of CPU): llguidance's mask computation "
            f"{100 * m['worker_cpu_fraction_of_step']:.1f}% of the step's CPU time, in a worker thread during the "
            f"forward; on the step's critical path (waiting for it after the forward, then applying it) "
            f"{100 * m['critical_path_fraction_of_step']:.1f}% of the wall step (rounds: "
            f"{', '.join(f'{100 * x:.1f}%' for x in m['critical_path_fraction_rounds'])})."]
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
