"""A long prompt and a cold start on a real-size GGUF, Speculant against llama.cpp, in
alternating rounds (issue 51).

``--part long``: one chat request of ``--prompt-tokens`` tokens (a repository file under an edit instruction)
then ``--max-tokens`` greedy tokens: TTFT, prefill rate, request rate (ours: default configuration, prefix
caching off; llama.cpp: the sdist's bindings). ``--part cold``: a fresh process to its exit after one token,
the conversion cached (ours: ``python -c`` with ``LLM(model=FILE)``, with the time of each import and of the
engine's build; llama.cpp: ``llama-completion -n 1``, whose exit stands for its first token); ``--full-load`` adds
our load before the skeleton (``loading/skeleton.py``): the whole dense conversion read, then kept quantized.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llamacpp_rows import LLAMA_BIN, LLAMA_PY, PlainLlama
from selftest_check import model_path

import harness

SOURCE = "speculant/engine/llm_engine.py"
INSTRUCTION = "Add type hints to every function in this Python module and change nothing else:\n\n```python\n"
COLD_CHILD = """
import sys, time
stages = [time.time()]
import torch
stages.append(time.time())
import transformers
stages.append(time.time())
from speculant import LLM, SamplingParams
stages.append(time.time())
if sys.argv[3] == "full":  # the load before the skeleton: the dense conversion, then keep_quantized
    import speculant.model.runner as runner
    from speculant.model.loading.skeleton import SkeletonMiss
    def full(*args, **kwargs):
        raise SkeletonMiss("the benchmark's full-load row")
    runner.load_kept_quantized = full
llm = LLM(model=sys.argv[1], max_num_seqs=1)
stages.append(time.time())
out = llm.generate([sys.argv[2]], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
print("FIRST_TOKEN", time.time(), out[0].outputs[0].token_ids, flush=True)
print("STAGES", *stages, flush=True)
"""
STAGES = ("python_start", "import_torch", "import_transformers", "import_speculant", "engine_built")


def long_prompt(tok, n_tokens: int) -> tuple[str, list[int]]:
    """A chat prompt of exactly ``n_tokens`` tokens: ``SOURCE`` cut to fit under ``INSTRUCTION``."""
    code = (harness.REPO_ROOT / SOURCE).read_text(encoding="utf-8")
    code_ids = tok(code, add_special_tokens=False)["input_ids"]

    def render(k: int) -> str:
        body = INSTRUCTION + tok.decode(code_ids[:k]) + "\n```"
        return tok.apply_chat_template([{"role": "user", "content": body}], add_generation_prompt=True,
                                       tokenize=False)
    lo, hi = 0, len(code_ids)
    while lo < hi:  # the longest cut that fits
        mid = (lo + hi + 1) // 2
        fits = len(tok(render(mid), add_special_tokens=False)["input_ids"]) <= n_tokens
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    text = render(lo)
    return text, list(tok(text, add_special_tokens=False)["input_ids"])


def run_long(args, bench, path: str, tok) -> dict[str, Any]:
    from speculant import LLM
    from speculant.bench.speculant_runs import _stream_one

    text, ids = long_prompt(tok, args.prompt_tokens)
    llm = LLM(model=path, enable_prefix_caching=False)
    llama = PlainLlama(args.llama_py, args.llama_bin, path, args.threads)
    same_prompt = llama.tokenize(text) == ids
    _stream_one(llm.loop, ids[:64], 4)
    llama.generate(ids[:64], 4)

    def run_one(name: str) -> dict[str, Any]:
        if name == "speculant":
            t = _stream_one(llm.loop, ids, args.max_tokens)
            n, seconds, ttft = len(t.tokens), t.seconds, t.ttft
        else:
            from speculant.bench.llamacpp import generate_alone

            toks, seconds, ttft, _ = generate_alone(llama.llm, ids, args.max_tokens)
            n = len(toks)
        return {"ttft_s": ttft, "prefill_tok_s": len(ids) / ttft, "tok_s": n / seconds, "tokens": n}

    runs = harness.rounds(["speculant", "llama.cpp"], args.repeats, run_one,
                          lambda r: f"TTFT {r['ttft_s']:.2f} s, prefill {r['prefill_tok_s']:.1f} tok/s")
    llama.close()
    return {"prompt_tokens": len(ids), "source": SOURCE, "llama_same_prompt_tokens": same_prompt,
            "max_num_batched_tokens": llm.config.scheduler.max_num_batched_tokens, "runs": runs,
            "summary": summarize(runs, ("ttft_s", "prefill_tok_s", "tok_s"))}


def run_cold(args, bench, path: str, tok) -> dict[str, Any]:
    text = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a string."}],
                                   add_generation_prompt=True, tokenize=False)

    def run_one(name: str) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            if name.startswith("speculant"):
                cmd = [sys.executable, "-c", COLD_CHILD, path, text, "full" if name.endswith("full") else "skeleton"]
            else:
                Path(tmp, "p.txt").write_text(text, encoding="utf-8")
                cmd = [str(Path(args.llama_bin) / "llama-completion"), "-m", path, "-f", str(Path(tmp, "p.txt")),
                       "-n", "1", "--temp", "0", "-t", str(args.threads), "-no-cnv", "--no-display-prompt",
                       "-c", "512"]
            t0 = time.time()
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            end = time.time()
        if out.returncode != 0:
            raise RuntimeError(f"{cmd[0]} exited {out.returncode}: {out.stderr[-1500:]}")
        lines = {line.split()[0]: line.split(maxsplit=1)[1] for line in out.stdout.splitlines()
                 if line.startswith(("FIRST_TOKEN", "STAGES"))}
        first = float(lines["FIRST_TOKEN"].split()[0]) if "FIRST_TOKEN" in lines else None
        # llama-completion prints no time of its first token: its exit (load, first token, teardown) stands in
        res: dict[str, Any] = {"to_exit_s": end - t0, "to_first_token_s": end - t0 if first is None else first - t0}
        if "STAGES" in lines:  # seconds from the parent's start of the process to each stage
            res["stages_s"] = {k: round(float(v) - t0, 3) for k, v in zip(STAGES, lines["STAGES"].split())}
            res["first_token"] = lines["FIRST_TOKEN"].split(maxsplit=1)[1]
        return res

    names = ["speculant", "llama.cpp"] + (["speculant_full"] if args.full_load else [])
    runs = harness.rounds(names, args.repeats, run_one, lambda r: f"{r['to_exit_s']:.2f} s to exit")
    return {"runs": runs, "summary": summarize(runs, ("to_exit_s", "to_first_token_s"))}


def summarize(runs: dict[str, list[dict[str, Any]]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Per key: each engine's median (min, max) and the per-round ratio speculant / llama.cpp."""
    out: dict[str, Any] = {}
    for key in keys:
        ratios = harness.per_round_ratios(runs, "speculant", "llama.cpp", key)
        out[key] = {name: {k: round(v, 3) for k, v in harness.summary([r[key] for r in rs]).items()
                           if k in ("median", "min", "max")} for name, rs in runs.items()}
        out[key]["ratio"] = {k: round(v, 3) for k, v in harness.summary(ratios).items()
                             if k in ("median", "min", "max")}
    return out


def main() -> None:
    ap = harness.arg_parser(__doc__, out=None, repeats=5, threads=2)
    ap.add_argument("--part", choices=("long", "cold"), required=True)
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON result (default: results/long_prompt_qwen15b.json or cold_start_qwen15b.json)")
    ap.add_argument("--model", default="qwen-1.5b-q4km", help="a fetch_gguf_parts name or a .gguf path")
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--full-load", action="store_true",
                    help="cold part: add the row that reads the whole dense conversion before keeping it quantized")
    ap.add_argument("--llama-py", default=LLAMA_PY)
    ap.add_argument("--llama-bin", default=LLAMA_BIN)
    args = ap.parse_args()
    args.out = args.out or harness.RESULTS_DIR / ("long_prompt_qwen15b.json" if args.part == "long"
                                                  else "cold_start_qwen15b.json")
    bench = harness.start(f"long_prompt_rows_{args.part}", args)
    from transformers import AutoTokenizer

    from speculant.model.loading.gguf_source import resolve_model_source

    path = model_path(args.model)
    tok = AutoTokenizer.from_pretrained(resolve_model_source(path, None, "bfloat16"))
    data = (run_long if args.part == "long" else run_cold)(args, bench, path, tok)
    for key, row in data["summary"].items():
        bench.log(f"{key}: ours {row['speculant']['median']:.3f}, llama.cpp {row['llama.cpp']['median']:.3f}, "
                  f"ratio {row['ratio']['median']:.3f} ({row['ratio']['min']:.3f}-{row['ratio']['max']:.3f})")
    bench.write({"model": Path(path).name, **data})


if __name__ == "__main__":
    main()
