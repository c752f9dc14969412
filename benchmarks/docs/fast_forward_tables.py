"""The docs tables of ``benchmarks/fast_forward_bench.py``: the fast decoder
(``model.fast_forward``) against transformers' modules on SmolLM2-135M, and
where a decode step's time goes on each path."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, _num, _x, markdown_table, measured_on

RESULT = "fast_forward_smollm2.json"
PARTS = (("layers", "decoder layers (GEMMs, attention, norms, rotary)"), ("lm_head", "LM head"),
         ("metadata", "attention metadata"), ("engine", "rest of the step (schedule, span tensors, sampling, "
                                                        "commit, detokenize)"))


def fast_forward(results: Path) -> list[str]:
    """The fast decoder against transformers' modules on SmolLM2-135M (``benchmarks/fast_forward_bench.py``)."""
    data = _load(results, RESULT)
    if data is None:
        return []
    w = data["workload"]
    out = markdown_table(
        f"The chat prompts of examples/prompts/edit_tasks.txt, batch 1, greedy, EOS ignored, {w['max_tokens']} new "
        f"tokens, prefill included, {data['options'].get('threads')} thread(s), k = {w['k']}, median of "
        f"{data['options'].get('repeats')} interleaved rounds; measured on {measured_on(data)} (a machine shared "
        "with other jobs).",
        ["dtype", "method", "model.fast_forward", "path", "tok/s", "vs off", "tok/s, CPU clock", "vs off",
         "output vs off", "tokens per verify step"],
        ([r["dtype"], r["method"], r["fast_forward"], r["path"], f"{r['tokens_per_s']:.1f}", _x(r["vs_off"]),
          _num(r.get("cpu_tokens_per_s")), _x(r.get("cpu_vs_off")),
          "identical" if r["same_tokens_as_off"] else "**differs**", _num(r.get("mean_accepted_length"), 2)]
         for r in data["rows"]))
    out += ["", "The CPU clock counts the process's CPU time (all threads): time descheduled by the "
                "machine's other jobs is left out, so it is the steadier comparison here."]
    return out + profile_table(data.get("step_profile_ms") or {},
                               "Milliseconds per bf16 decode step (one prompt, no speculation, wall clock, so on a "
                               "loaded machine inflated alike for both paths):")


def profile_table(profile: dict[str, dict[str, float]], intro: str) -> list[str]:
    """Milliseconds per step, one column per row of the benchmark (empty without a profile)."""
    if not profile:
        return []
    names = list(profile)
    rows = [[label, *(_num(profile[n].get(key), 2) for n in names)] for key, label in PARTS]
    rows.append(["**step**", *(f"**{_num(profile[n].get('step'), 2)}**" for n in names)])
    return ["", *markdown_table(intro, ["part", *names], rows)]


def fast_forward_headline(results: Path) -> list[str]:
    data = _load(results, RESULT)
    if data is None:
        return []
    rows = {r["row"]: r for r in data["rows"]}
    on, off = rows.get("bf16 no_spec on"), rows.get("bf16 no_spec off")
    if not (on and off):
        return []
    same = "output identical" if on["same_tokens_as_off"] else "output **differs**"
    return [f"| SmolLM2-135M bf16 on the CPU, batch 1: the fast decoder vs transformers' modules "
            f"({data['options'].get('threads')} thread(s)) | {on['tokens_per_s']:.1f} vs {off['tokens_per_s']:.1f} "
            f"tok/s ({on['vs_off']:.2f}×; {_x(on.get('cpu_vs_off'))} on the CPU clock), {same} | {measured_on(data)} | "
            f"[fast forward](docs/benchmarks.md#results-fast-forward) |"]


KERNELS_RESULT = "cpu_kernels_smollm2.json"
KERNEL_SETS = {"onednn": "oneDNN linears, torch norms and rotary", "dot": "our bf16 linears (fused residual add)",
               "all": "our linears, RMSNorm, rotary and silu, one call per operator",
               "fused": "the same kernels, all layers in one C call (the default)"}


def cpu_kernels(results: Path) -> list[str]:
    """Speculant's own bf16 CPU kernels switched on one by one (``benchmarks/cpu_kernels_bench.py``)."""
    data = _load(results, KERNELS_RESULT)
    if data is None:
        return []
    w = data["workload"]
    out = markdown_table(
        f"SmolLM2-135M bf16, fast decoder on, the chat prompts of examples/prompts/edit_tasks.txt, batch 1, "
        f"greedy, EOS ignored, {w['max_tokens']} new tokens, {data['options'].get('threads')} thread(s), suffix at "
        f"k = {w['k']}, median of {data['options'].get('repeats')} interleaved rounds; measured on "
        f"{measured_on(data)}. bf16 outputs may part from the oneDNN row at a near-tie (the float32 sums run "
        "in another order), and suffix then drafts from other text: compare speculative rows by step time.",
        ["method", "kernels", "tok/s", "vs oneDNN", "output vs oneDNN", "tokens per verify step"],
        ([r["method"], KERNEL_SETS.get(r["kernels"], r["kernels"]), f"{r['tokens_per_s']:.1f}", _x(r["vs_onednn"]),
          "identical" if r["same_tokens_as_onednn"] else "parts at a near-tie", _num(r.get("mean_accepted_length"), 2)]
         for r in data["rows"]))
    return out + profile_table(data.get("step_profile_ms") or {},
                               "Milliseconds per decode step (one prompt, no speculation, wall clock):")


def cpu_kernels_headline(results: Path) -> list[str]:
    data = _load(results, KERNELS_RESULT)
    profile = (data or {}).get("step_profile_ms") or {}
    before, after = profile.get("no_spec onednn"), profile.get("no_spec fused") or profile.get("no_spec all")
    if data is None or not (before and after):
        return []
    return [f"| SmolLM2-135M bf16 decode step on the CPU: oneDNN linears and torch norms/rotary vs Speculant's own "
            f"kernels | {before['step']:.1f} → {after['step']:.1f} ms ({before['step'] / after['step']:.2f}×) | "
            f"{measured_on(data)} | [cpu kernels](docs/benchmarks.md#results-cpu-kernels) |"]
