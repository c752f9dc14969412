"""The fast decoder (``model.fast_forward``) against transformers' modules on SmolLM2-135M (issue 29).

The workload of ``llamacpp_compare.py``: the chat-rendered prompts of
``examples/prompts/edit_tasks.txt``, one request at a time, greedy, EOS ignored,
128 new tokens, prefill included, ``--threads`` threads. Rows, all in one
process and interleaved round by round: bf16 and float32 without speculation
with ``fast_forward`` off and on, and bf16 with ngram and suffix at k = 8, off
and on. A per-step profile follows (one prompt, bf16, no speculation, both
paths): milliseconds per decode step in the layers, the attention metadata,
the LM head, and the engine outside the forward (scheduling, sampling,
commit). Writes ``results/fast_forward_smollm2.json``.

    python benchmarks/fast_forward_bench.py            # ~6 minutes on 2 cores
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import harness

# wall-clock tok/s as everywhere, and tok/s on the process's CPU clock (all threads), which a
# machine shared with other jobs disturbs less: descheduled time is not counted.
ROWS = {
    # name: (dtype, speculative or None, fast_forward)
    "bf16 no_spec off": ("bfloat16", None, "off"),
    "bf16 no_spec on": ("bfloat16", None, "on"),
    "bf16 ngram off": ("bfloat16", "ngram", "off"),
    "bf16 ngram on": ("bfloat16", "ngram", "on"),
    "bf16 suffix off": ("bfloat16", "suffix", "off"),
    "bf16 suffix on": ("bfloat16", "suffix", "on"),
    "fp32 no_spec off": ("float32", None, "off"),
    "fp32 no_spec on": ("float32", None, "on"),
}


def build(target: str, dtype: str, proposer: str | None, fast: str, k: int):
    from speculant.bench.speculant_runs import Method, build_llm
    from speculant.model.loading.gguf_source import resolve_model_source

    model_dir = resolve_model_source(target, None, dtype, option="--target")
    spec = {"proposer": proposer, "num_speculative_tokens": k} if proposer else None
    return build_llm(str(model_dir), Method(proposer or "no_spec", spec), 1, dtype, "cpu", fast_forward=fast)


def chat_ids(llm, texts: list[str]) -> list[list[int]]:
    from speculant.bench import render_prompts

    return render_prompts(llm.tokenizer, texts, True)


class StepProfile:
    """Wall seconds per part of each engine step, by patching this engine's own objects."""

    PARTS = ("metadata", "layers", "lm_head", "engine")

    def __init__(self, llm) -> None:
        self.llm, self.seconds = llm, defaultdict(float)
        runner = llm.engine.runner
        self._patch(runner.backend, "build_metadata", "metadata")
        head = runner.model.get_output_embeddings()
        self._patch(head, "forward", "lm_head")
        decoder = runner.fast_forward.decoder
        self._patch(decoder if decoder is not None else runner.model.model, "forward", "layers")

    def _patch(self, obj, attr: str, part: str) -> None:
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
        setattr(obj, attr, timed)

    def run(self, prompt: list[int], max_tokens: int) -> dict[str, float]:
        from speculant.bench.speculant_runs import greedy

        eng = self.llm.engine
        eng.add_request(None, prompt, greedy(max_tokens))
        eng.step()  # the prefill (and first token): not a decode step
        self.seconds.clear()
        steps, start = 0, time.perf_counter()
        while eng.has_unfinished_requests():
            eng.step()
            steps += 1
        total = time.perf_counter() - start
        forward = sum(self.seconds[p] for p in ("metadata", "layers", "lm_head"))
        out = {p: 1e3 * self.seconds[p] / steps for p in ("metadata", "layers", "lm_head")}
        out["engine"] = 1e3 * (total - forward) / steps  # schedule, SpanTensors, sampling, commit, detokenize
        out["step"] = 1e3 * total / steps
        return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "fast_forward_smollm2.json", repeats=2, threads=2,
                            quick="16 new tokens, one round, two prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS),
                    help="run only these rows (each with its 'off' partner)")
    args = ap.parse_args()
    wanted = {r for name in args.rows for r in (name, f"{name.rsplit(' ', 1)[0]} off")}
    for name in [n for n in ROWS if n not in wanted]:
        del ROWS[name]
    bench = harness.start("fast_forward_smollm2", args)
    from speculant.bench import load_prompts
    from speculant.bench.speculant_runs import run_method

    texts = load_prompts("examples/prompts/edit_tasks.txt")
    max_tokens, repeats = (16, 1) if args.quick else (args.max_tokens, args.repeats)
    texts = texts[:2] if args.quick else texts
    target = harness.smollm2_path()
    llms, loads = {}, {}
    for name, (dtype, proposer, fast) in ROWS.items():
        bench.log(f"loading {name} ...")
        start = time.perf_counter()
        llms[name] = build(target, dtype, proposer, fast, args.k)
        loads[name] = time.perf_counter() - start
    prompts = chat_ids(next(iter(llms.values())), texts)

    def run_one(name: str) -> dict[str, Any]:
        start = time.process_time()  # the process's CPU time: leaves out time descheduled by other jobs
        res = run_method(llms[name], prompts, max_tokens, 1, 1)
        res["cpu_tokens_per_s"] = res["num_tokens"] / (time.process_time() - start)
        return res

    runs = harness.rounds(list(ROWS), repeats, run_one, lambda r: f"{r['tokens_per_s']:.1f} tok/s")
    rows = []
    for name, (dtype, proposer, fast) in ROWS.items():
        rates = [r["tokens_per_s"] for r in runs[name]]
        status = llms[name].engine.runner.fast_forward
        base = runs[f"{name.rsplit(' ', 1)[0]} off"][-1]["token_ids"]
        rows.append({"row": name, "dtype": dtype, "method": proposer or "no_spec", "fast_forward": fast,
                     "path": "fast decoder" if status.active else "transformers' modules",
                     "tokens_per_s": round(harness.median(rates), 2),
                     "tokens_per_s_samples": [round(r, 2) for r in rates],
                     "cpu_tokens_per_s": round(harness.median([r["cpu_tokens_per_s"] for r in runs[name]]), 2),
                     "mean_accepted_length": runs[name][-1]["mean_accepted_length"],
                     "same_tokens_as_off": runs[name][-1]["token_ids"] == base,
                     "load_s": round(loads[name], 2), "build_s": round(status.build_s, 4),
                     "probe_s": round(status.probe_s, 4)})
    for r in rows:
        off = next(o for o in rows if o["row"] == r["row"].rsplit(" ", 1)[0] + " off")
        r["vs_off"] = round(r["tokens_per_s"] / off["tokens_per_s"], 3)
        r["cpu_vs_off"] = round(r["cpu_tokens_per_s"] / off["cpu_tokens_per_s"], 3)
        print(f"{r['row']:<18} {r['tokens_per_s']:7.1f} tok/s  {r['vs_off']:.2f}x off  (CPU clock "
              f"{r['cpu_tokens_per_s']:.1f}, {r['cpu_vs_off']:.2f}x)  same: {r['same_tokens_as_off']}")
    profile = {}
    for name in [n for n in ("bf16 no_spec off", "bf16 no_spec on") if n in llms]:
        profile[name] = StepProfile(llms[name]).run(prompts[0], max_tokens)
        print(name, profile[name])
    bench.write({"workload": {"prompts": "examples/prompts/edit_tasks.txt (chat)", "max_tokens": max_tokens,
                              "k": args.k, "batch": 1, "greedy": True, "ignore_eos": True},
                 "rows": rows, "step_profile_ms": profile,
                 "step_profile_note": "ms per decode step, one prompt, wall clock: layers (the decoder's "
                                      "layer loop incl. attention), metadata (attention backend's), lm_head, "
                                      "engine (everything else in a step: scheduling, span tensors, "
                                      "sampling, commit, detokenizing)"})


if __name__ == "__main__":
    main()
