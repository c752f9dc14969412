"""The load-time self-test's errors and the attention backends' agreement on a real model.

For each dtype and attention backend: load the model (timing it), record the
self-test's largest per-layer error against the upcast reference next to
transformers' own error, then generate greedily and record whether every
backend gave the same tokens. Written to ``--out`` with the machine and date.

    python benchmarks/selftest_check.py --model smollm2 --dtypes float32 bfloat16
    python benchmarks/selftest_check.py --model qwen-1.5b-q4km --dtypes bfloat16 \\
        --out benchmarks/results/selftest_qwen15b.json
"""

from __future__ import annotations

import gc
import time

from fetch_gguf_parts import MODELS, default_dir, fetch

import harness

PROMPTS = ["def quicksort(arr):", "Write a Python function that checks whether a string is a palindrome."]


def model_path(name: str) -> str:
    if name == "smollm2":
        return harness.smollm2_path()
    if name in MODELS:
        return str(fetch(name, default_dir()))
    return name  # a path


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "selftest_smollm2.json", threads=2)
    ap.add_argument("--model", default="smollm2", help="smollm2, a fetch_gguf_parts name, or a path")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--backends", nargs="+", default=["cpu_kernel", "torch"])
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    bench = harness.start("selftest_check", args)
    from speculant import LLM, SamplingParams

    path, rows = model_path(args.model), []
    for dtype in args.dtypes:
        tokens = {}
        for backend in args.backends:
            t0 = time.perf_counter()
            llm = LLM(model=path, dtype=dtype, attention_backend=backend, max_num_batched_tokens=256,
                      max_num_seqs=4)
            load_s = time.perf_counter() - t0
            runner, params = llm.engine.runner, SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                                               ignore_eos=True)
            outs = llm.generate(PROMPTS, params, use_tqdm=False)
            tokens[backend] = [o.outputs[0].token_ids for o in outs]
            test = runner.self_test
            rows.append(dict(dtype=dtype, backend=backend, load_s=round(load_s, 1),
                             engine_error=test.engine_error, transformers_error=test.transformers_error,
                             worst_layer=test.worst_layer, max_model_len=runner.max_model_len))
            bench.log(f"{dtype} {backend}: {test.describe()}")
            del llm, runner, outs
            gc.collect()
        same = all(t == tokens[args.backends[0]] for t in tokens.values())
        for row in rows:
            if row["dtype"] == dtype:
                row["same_tokens_as_" + args.backends[0]] = same
    bench.write({"model": args.model, "prompts": PROMPTS, "max_tokens": args.max_tokens, "rows": rows})


if __name__ == "__main__":
    main()
