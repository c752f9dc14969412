"""Issue 51's real-size docs tables (1.5B rows, long prompt, cold start, agreement, SmolLM2 Q4_1)."""

from __future__ import annotations

from pathlib import Path

from .tables import _load, _num, _x, measured_on

NAMES = {"no_spec": "Speculant, no speculation", "ngram": "Speculant, ngram", "suffix": "Speculant, suffix",
         "draft": "Speculant, 0.5B draft model", "llama_plain": "llama.cpp plain (Python bindings)",
         "llama_bench": "llama.cpp plain (`llama-bench` pp + tg)",
         "llama_lookup": "llama.cpp `llama-lookup`", "llama_speculative": "llama.cpp `llama-speculative`, 0.5B draft"}


def _spread(r: dict | None) -> str:
    return "–" if r is None else f"{_x(r['median'])} ({_x(r['min'])}–{_x(r['max'])})"


def _same(row: dict, plain_digests: dict[str, str]) -> str:
    """Same greedy tokens as speculation off in that engine, and as the no-speculation engine."""
    if row.get("matches_no_spec") is None:
        return "–"
    same = "yes" if row["matches_no_spec"] else "**no**"
    plain_digest = plain_digests.get("no_spec_dq" if row["row"].endswith("_dq") else "no_spec")
    if plain_digest is not None:
        same += "; = no-speculation engine: " + ("yes" if row.get("digest") == plain_digest else "**no**")
    return same


def real_size_rows(results: Path) -> list[str]:
    """Qwen2.5-Coder-1.5B Q4_K_M at batch 1: Speculant's rows against llama.cpp plain, lookup and speculative"""
    runs = [(p.name, _load(results, p.name)) for p in sorted(results.glob("real_size_*.json"))]
    return _rows_table([(name, d) for name, d in runs if d and d.get("benchmark") == "real_size_rows"],
                       "One Speculant engine per run (3 GB each): runs compare through their llama.cpp plain row.")


def smollm2_q4_1(results: Path) -> list[str]:
    """SmolLM2-135M Q4_1 (the demo's file): kept quantized or dequantized to bf16, against llama.cpp on the file"""
    data = _load(results, "smollm2_q4_1_rows.json")
    return _rows_table([("smollm2_q4_1_rows.json", data)] if data else [],
                       "Rows marked *dequantized* run the file converted to bfloat16 (`model.quantization = "
                       "\"dequantize\"`), the others keep its Q4_1 blocks (the default).")


def _nearest_plain_digests(runs: list[tuple[str, dict]], data: dict) -> dict[str, str]:
    """The no-speculation rows' digests for ``data``'s rows: of the run measured nearest in time (its own
    first), so a run on other kernels (whose bits differ) is not the reference."""
    def when(d: dict) -> float:
        from datetime import datetime

        stamp = d["environment"].get("date_utc")
        return datetime.fromisoformat(stamp).timestamp() if stamp else 0.0

    out: dict[str, str] = {}
    for _, d in sorted(runs, key=lambda run: -abs(when(run[1]) - when(data)) if run[1] is not data else 1.0):
        out.update({r["row"]: r["digest"] for r in d["rows"] if r["row"] in ("no_spec", "no_spec_dq")})
    return out


def _rows_table(runs: list[tuple[str, dict]], note: str) -> list[str]:
    if not runs:
        return []
    first = runs[0][1]
    o = first["options"]
    out = [f"{first['target']}, {o['prompts']} edit prompts (chat, {first['prompt_tokens']} prompt tokens) × "
           f"{o['max_tokens']} new tokens, greedy, EOS ignored, batch 1, {o['threads']} threads, prefill included, "
           f"load left out; ngram, suffix and `llama-lookup` at k = {o['k']}, the draft rows "
           f"({first['draft']}) at k = {o['draft_k']}; median tok/s of {o['repeats']} alternating rounds "
           f"(min–max). {note}",
           "", "| run | row | tok/s (min–max) | vs llama.cpp plain, per round (min–max) | tokens per step | "
               "acceptance | output = no speculation |", "|---|---|---|---|---|---|---|"]
    for name, data in runs:
        plain_digests = _nearest_plain_digests(runs, data)
        for r in data["rows"]:
            acc, row = r.get("acceptance"), r["row"].removesuffix("_dq")
            label = NAMES.get(row, row) + (", *dequantized*" if r["row"].endswith("_dq") else "")
            out.append(f"| {name.removeprefix('real_size_').removesuffix('.json')} | {label} | "
                       f"{_num(r['median'], 2)} ({_num(r['min'], 2)}–{_num(r['max'], 2)}) | "
                       f"{_spread(r.get('vs_llama_plain'))} | {_num(r.get('tokens_per_step'), 2)} | "
                       f"{'–' if acc is None else f'{acc:.0%}'} | {_same(r, plain_digests)} |")
    out.append("")
    out += [f"- `{name}`: {measured_on(d)}, load {d['environment'].get('load_avg', [0])[0]}." for name, d in runs]
    return out


def _ours_theirs(row: dict, digits: int = 2) -> list[str]:
    ours, theirs, ratio = row["speculant"], row["llama.cpp"], row["ratio"]
    return [f"{_num(ours['median'], digits)} ({_num(ours['min'], digits)}–{_num(ours['max'], digits)})",
            f"{_num(theirs['median'], digits)} ({_num(theirs['min'], digits)}–{_num(theirs['max'], digits)})",
            _spread(ratio)]


def long_prompt_cold_start(results: Path) -> list[str]:
    """Qwen2.5-Coder-1.5B Q4_K_M: a long prompt (prefill rate, time to first token) and cold start vs llama.cpp"""
    long, cold = _load(results, "long_prompt_qwen15b.json"), _load(results, "cold_start_qwen15b.json")
    out: list[str] = []
    if long:
        s, o = long["summary"], long["options"]
        out += [f"One chat request of {long['prompt_tokens']} prompt tokens (`{long['source']}` under an edit "
                f"instruction) then {o['max_tokens']} greedy tokens, alone, {o['threads']} threads; Speculant's "
                f"default configuration for the file (chunked prefill, {long['max_num_batched_tokens']} tokens a "
                "step), llama.cpp through the sdist's bindings (batch 512); median of "
                f"{o['repeats']} alternating rounds (min–max); measured on {measured_on(long)}, load "
                f"{long['environment'].get('load_avg')}:", "",
                "| measure | Speculant | llama.cpp | Speculant / llama.cpp, per round |", "|---|---|---|---|",
                "| time to first token, s | " + " | ".join(_ours_theirs(s["ttft_s"])) + " |",
                "| prefill rate, tok/s | " + " | ".join(_ours_theirs(s["prefill_tok_s"], 1)) + " |",
                "| whole request, tok/s | " + " | ".join(_ours_theirs(s["tok_s"])) + " |"]
    if cold:
        s, o = cold["summary"], cold["options"]
        out += ["", f"Cold start: a fresh process from its start to its exit after one token (Speculant: "
                    f"`python -c` building `LLM(model=FILE)`, the GGUF conversion cached; llama.cpp: "
                    f"`llama-completion -n 1`), files in the page cache, {o['threads']} threads, median of "
                    f"{o['repeats']} alternating rounds; measured on {measured_on(cold)}, load "
                    f"{cold['environment'].get('load_avg')}:", "",
                "| measure | Speculant | llama.cpp | Speculant / llama.cpp, per round |", "|---|---|---|---|",
                "| process start to exit after the first token, s | " + " | ".join(_ours_theirs(s["to_exit_s"]))
                + " |"]
        if "to_first_token_s" in s:
            out += ["| process start to the first token, s (llama.cpp: to its exit) | "
                    + " | ".join(_ours_theirs(s["to_first_token_s"])) + " |"]
        out += _cold_stages(cold)
    return out


def _cold_stages(cold: dict) -> list[str]:
    """Our cold start by stage (seconds from the process's start, medians), skeleton and full load."""
    runs = {name: rs for name, rs in cold["runs"].items() if rs and "stages_s" in rs[0]}
    if not runs:
        return []
    labels = {"speculant": "skeleton load (default)", "speculant_full": "full load (dense conversion read first)"}
    stages = list(next(iter(runs.values()))[0]["stages_s"])
    rows = []
    for name, rs in runs.items():
        med = [_num(sorted(r["stages_s"][k] for r in rs)[len(rs) // 2], 2) for k in stages]
        first = _num(sorted(r["to_first_token_s"] for r in rs)[len(rs) // 2], 2)
        rows.append(f"| {labels.get(name, name)} | " + " | ".join(med[1:]) + f" | {first} |")
    return ["", "Where our cold start goes: seconds from the process's start to the end of each stage, median "
                "per stage (`import speculant` imports transformers' modeling code):", "",
            "| load | " + " | ".join(k.replace("_", " ") for k in stages[1:]) + " | first token |",
            "|---" * len(stages) + "|---|", *rows]


def agreement(results: Path) -> list[str]:
    """Qwen2.5-Coder-1.5B Q4_K_M: greedy agreement with llama.cpp on the same file"""
    data = _load(results, "llamacpp_agreement_qwen15b.json")
    if data is None:
        return []
    split = [r for r in data["rows"] if not r["same"]]
    ties = sum(r["ours_top2_margin"] == 0 for r in split)
    o, dtype = data["options"], data.get("logits_dtype", "torch.bfloat16").removeprefix("torch.")
    return [f"{data['same_first_tokens']} of {data['prompts']} chat prompts ({', '.join(data['prompt_files'])}) give "
            f"the same first {o['tokens']} greedy tokens in Speculant (quantized, no speculation) and llama.cpp; "
            f"measured on {measured_on(data)}. Where they split, each engine's margin between its top two "
            f"logits (the largest: {_num(data['max_top2_margin_at_split'], 3)}; {ties} of {len(split)} splits "
            f"were exact ties in Speculant's logits, {dtype} in this run). At each split, "
            "first differing token: top-2 margin Speculant / llama.cpp — "
            + "; ".join(f"{r['first_difference']}: {r['ours_top2_margin']:.2f} / {r['llamacpp_top2_margin']:.2f}"
                        for r in split) + "."]


def concurrency(results: Path) -> list[str]:
    """Qwen2.5-Coder-1.5B Q4_K_M: 32 concurrent requests against one at a time, no speculation"""
    data = _load(results, "real_size_concurrency.json")
    if data is None:
        return []
    s, o = data["summary"], data["options"]
    return [f"`real_size_concurrency.py`: one engine (quantized, no "
            f"speculation, no prefix caching), edit prompts (chat, "
            f"{data['prompt_tokens']} tokens), {o['max_tokens']} new tokens each, greedy, prefill included, "
            f"{o['threads']} threads; median of {o['repeats']} alternating rounds (min–max); measured on "
            f"{measured_on(data)}, load {data['environment'].get('load_avg')}:", "",
            "| row | tok/s (min–max) |", "|---|---|",
            f"| {o['batch1_prompts']} requests one at a time | {_num(s['batch1']['median'], 2)} "
            f"({_num(s['batch1']['min'], 2)}–{_num(s['batch1']['max'], 2)}) |",
            f"| {o['requests']} requests at once | {_num(s['concurrent']['median'], 2)} "
            f"({_num(s['concurrent']['min'], 2)}–{_num(s['concurrent']['max'], 2)}) |", "",
            f"Concurrent over batch 1, per round: {_spread(s['ratio'])}."]


def step_profile(results: Path) -> list[str]:
    """Qwen2.5-Coder-1.5B Q4_K_M kept quantized: where a step's time goes"""
    data = _load(results, "quant_step_profile.json")
    if data is None:
        return []
    o, rows = data["options"], data["rows"]
    labels = {"decode_1": "1 decode (context 120)", "decode_32": "32 decodes (contexts 60–308)",
              "prefill_512": "a 512-token prefill chunk"}
    return [f"`quant_step_profile.py`: one engine step through `ModelRunner.forward` ({data['fast_forward']}), "
            "then its parts timed alone on the step's shapes: every quantized linear layer but the output layer "
            "(one call per matrix), the output layer on the rows with logits; "
            "the rest is the step less those calls, which repeat one matrix and so find it in cache (where the "
            "time goes: benchmarks/README.md). Milliseconds, median of "
            f"{o['repeats']} calls, {o['threads']} threads; measured on {measured_on(data)}, load "
            f"{data['environment'].get('load_avg')}:", "",
            "| step | tokens | step, ms | quant GEMM | output layer | rest |", "|---|---|---|---|---|---|",
            *(f"| {labels.get(name, name)} | {r['tokens']} | {_num(r['step_ms'], 1)} | {_num(r['quant_gemm_ms'], 1)} | "
              f"{_num(r['output_layer_ms'], 1)} | {_num(r['rest_ms'], 1)} |" for name, r in rows.items())]
