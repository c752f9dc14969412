"""Issue 51's batch-1 rows on a real-size GGUF: Speculant against llama.cpp, edit chat
prompts, greedy, EOS ignored, prefill included, rows side by side in alternating rounds.

Rows (``--rows``): ``no_spec``, ``ngram``, ``suffix``, ``draft`` (file kept quantized; ``_dq`` added: dequantized
to bf16), one engine each (about 3 GB at 1.5B); ``llama_plain``, ``llama_bench``, ``llama_lookup``,
``llama_speculative`` (``llamacpp_rows.py``). Speculative rows record whether their greedy tokens equal the same
requests with speculation off (and a digest to compare runs); every row gets its per-round ratio to ``llama_plain``.

    PYTHONPATH=/path/with/diskcache python benchmarks/real_size_rows.py --rows no_spec,llama_plain --prompts 2
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from llamacpp_rows import LLAMA_BIN, LLAMA_PY, PlainLlama, binaries, llama_bench_rate, run_binary
from selftest_check import model_path

import harness

SPECULANT_ROWS = ("no_spec", "ngram", "suffix", "draft")
LLAMA_ROWS = ("llama_plain", "llama_bench", "llama_lookup", "llama_speculative")
FIXED = {"policy": "fixed"}


def speculative_config(row: str, k: int, draft_k: int, draft: str) -> dict[str, Any] | None:
    if row == "no_spec":
        return None
    if row == "draft":
        return {"proposer": "draft_model", "num_speculative_tokens": draft_k, "draft_length": FIXED,
                "proposer_options": {"model": draft}}
    return {"proposer": row, "num_speculative_tokens": k, "draft_length": FIXED}


def digest(tokens: list[list[int]]) -> str:
    return hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]


class SpeculantRow:
    """One engine; ``run`` times every prompt alone, ``tokens`` keeps the first round's output."""

    def __init__(self, row: str, target: str, spec: dict[str, Any] | None, max_tokens: int) -> None:
        from speculant import LLM

        dense = {"quantization": "dequantize", "dtype": "bfloat16"} if row.endswith("_dq") else {}
        self.llm = LLM(model=target, max_num_seqs=1, max_num_batched_tokens=512, seed=0,
                       enable_prefix_caching=False, **dense, **({"speculative": spec} if spec else {}))
        self.row, self.spec, self.max_tokens = row, spec, max_tokens
        self.tokens: list[list[int]] | None = None

    def params(self, off: bool = False):
        from speculant import SamplingParams

        return SamplingParams(temperature=0, max_tokens=self.max_tokens, ignore_eos=True,
                              speculative={"enabled": False} if off else None)

    def warm_up(self, prompt: list[int]) -> None:
        from speculant import SamplingParams

        self.llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)

    def run(self, prompts: list[list[int]]) -> dict[str, Any]:
        self.llm.engine.reset_metrics()  # tokens per step of this round only
        seconds, outs = 0.0, []
        for p in prompts:
            with harness.timed() as t:
                out = self.llm.generate([p], self.params(), use_tqdm=False)[0].outputs[0].token_ids
            seconds += t.wall
            outs.append(list(out))
        self.tokens = self.tokens or outs
        n = sum(map(len, outs))
        res: dict[str, Any] = {"tok_s": n / seconds, "tokens": n, "seconds": seconds}
        if self.spec is not None:
            metrics = self.llm.get_metrics()
            res["tokens_per_step"], res["acceptance"] = (metrics.get("mean_accepted_length"),
                                                         metrics.get("acceptance_rate"))
        return res

    def check(self, prompts: list[list[int]]) -> dict[str, Any]:
        """Greedy tokens with speculation off for these requests, against the timed rounds' tokens."""
        ref = [list(self.llm.generate([p], self.params(off=True), use_tqdm=False)[0].outputs[0].token_ids)
               for p in prompts]
        same = None if self.spec is None else ref == self.tokens
        return {"digest": digest(self.tokens or []), "matches_no_spec": same}


class LlamaRows:
    """llama.cpp's rows: the bindings for ``llama_plain``, the binaries for the other two."""

    def __init__(self, args, target: str, draft: str, texts: list[str], workdir: Path) -> None:
        self.args, self.target, self.draft = args, target, draft
        self.bins = binaries(args.llama_bin)
        self.files = []
        for i, text in enumerate(texts):
            self.files.append(workdir / f"prompt{i}.txt")
            self.files[-1].write_text(text, encoding="utf-8")
        self.plain = PlainLlama(args.llama_py, args.llama_bin, target, args.threads)
        self.prompts = [self.plain.tokenize(t) for t in texts]

    def run(self, row: str) -> dict[str, Any]:
        if row == "llama_plain":
            seconds, n = 0.0, 0
            for p in self.prompts:
                toks, s = self.plain.generate(p, self.args.max_tokens)
                seconds, n = seconds + s, n + len(toks)
            return {"tok_s": n / seconds, "tokens": n, "seconds": seconds}
        if row == "llama_bench":
            mean = round(sum(map(len, self.prompts)) / len(self.prompts))
            return llama_bench_rate(self.args.llama_bin, self.target, mean, self.args.max_tokens, self.args.threads)
        name = row.removeprefix("llama_")
        k = self.args.k if name == "lookup" else self.args.draft_k
        runs = [run_binary(self.bins[name], self.target, f, max_tokens=self.args.max_tokens,
                           threads=self.args.threads, k=k, draft=self.draft if name == "speculative" else None)
                for f in self.files]
        n, seconds = sum(r.tokens for r in runs), sum(r.seconds for r in runs)
        drafted, accepted = sum(r.drafted or 0 for r in runs), sum(r.accepted or 0 for r in runs)
        return {"tok_s": n / seconds, "tokens": n, "seconds": seconds, "prompt_tokens": [r.prompt_tokens for r in runs],
                "acceptance": accepted / drafted if drafted else None}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "real_size_rows.json", repeats=5, threads=2)
    ap.add_argument("--rows", default="no_spec,llama_plain,llama_lookup,llama_speculative")
    ap.add_argument("--target", default="qwen-1.5b-q4km", help="smollm2, a fetch_gguf_parts name or a .gguf path")
    ap.add_argument("--draft", default="qwen-0.5b", help="the draft model's GGUF (fetch_gguf_parts name or path)")
    ap.add_argument("--prompts", type=int, default=4, help="the first N of examples/prompts/edit_tasks.txt")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8, help="drafted tokens per step: ngram, suffix, llama-lookup")
    ap.add_argument("--draft-k", type=int, default=4, help="drafted tokens per step with the 0.5B draft model")
    ap.add_argument("--llama-py", default=LLAMA_PY, help="the llama-cpp-python sdist (its llama_cpp package)")
    ap.add_argument("--llama-bin", default=LLAMA_BIN, help="the native build's bin/ (binaries and libllama.so)")
    args = ap.parse_args()
    rows = args.rows.split(",")
    unknown = [r for r in rows if r.removesuffix("_dq") not in SPECULANT_ROWS and r not in LLAMA_ROWS]
    if unknown:
        raise SystemExit(f"--rows: unknown {unknown}; choose from {', '.join(SPECULANT_ROWS + LLAMA_ROWS)}")
    bench = harness.start("real_size_rows", args)
    from transformers import AutoTokenizer

    from speculant.bench import load_prompts
    from speculant.model.loading.gguf_source import resolve_model_source

    target, draft = model_path(args.target), model_path(args.draft)
    texts = load_prompts("examples/prompts/edit_tasks.txt")[:args.prompts]
    tok = AutoTokenizer.from_pretrained(resolve_model_source(target, None, "bfloat16", option="--target"))
    chats = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
             for t in texts]
    ids = [list(tok(c, add_special_tokens=False)["input_ids"]) for c in chats]
    engines = {r: SpeculantRow(r, target, speculative_config(r.removesuffix("_dq"), args.k, args.draft_k, draft),
                               args.max_tokens) for r in rows if r not in LLAMA_ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        llama = LlamaRows(args, target, draft, chats, Path(tmp)) if any(r in LLAMA_ROWS for r in rows) else None
        same_prompts = None if llama is None else llama.prompts == ids
        warm = ids[0][::-1]
        for eng in engines.values():
            eng.warm_up(warm)
        if llama is not None:
            llama.plain.generate(warm, 4)

        def run_one(row: str) -> dict[str, Any]:
            return engines[row].run(ids) if row in engines else llama.run(row)  # type: ignore[union-attr]

        runs = harness.rounds(rows, args.repeats, run_one, lambda r: f"{r['tok_s']:.2f} tok/s")
        checks = {r: e.check(ids) for r, e in engines.items()}
        if llama is not None:
            llama.plain.close()
    summary = []
    for r in rows:
        rates = [x["tok_s"] for x in runs[r]]
        row = {"row": r, **{k: round(v, 3) for k, v in harness.summary(rates).items() if k in ("median", "min", "max")},
               **checks.get(r, {})}
        for key in ("tokens_per_step", "acceptance"):
            vals = [x[key] for x in runs[r] if x.get(key) is not None]
            if vals:
                row[key] = round(harness.median(vals), 3)
        if "llama_plain" in rows and r != "llama_plain":
            ratios = harness.per_round_ratios(runs, r, "llama_plain", "tok_s")
            row["vs_llama_plain"] = {k: round(v, 3) for k, v in harness.summary(ratios).items()
                                     if k in ("median", "min", "max")}
        summary.append(row)
        bench.log(f"{r:>18}: {row['median']:.2f} tok/s ({row['min']:.2f}-{row['max']:.2f})"
                  + (f", {row['vs_llama_plain']['median']:.2f}x llama plain" if "vs_llama_plain" in row else "")
                  + (f", same tokens as off: {row['matches_no_spec']}" if row.get("matches_no_spec") is not None
                     else ""))
    for rs in runs.values():
        for x in rs:
            x.pop("prompt_tokens", None)
    bench.write({"target": Path(target).name, "draft": Path(draft).name, "prompt_tokens": [len(p) for p in ids],
                 "llama_same_prompt_tokens": same_prompts, "rows": summary, "runs": runs})


if __name__ == "__main__":
    main()
