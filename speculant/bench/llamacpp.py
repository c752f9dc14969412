"""llama.cpp rows for ``speculant bench --llamacpp FILE.gguf``: the CPU peer a
person with a GGUF file would run, on the same prompts.

Each GGUF file given is one row, ``engine = "llama.cpp"``, measured as
Speculant's batch-1 rows are: the same prompt token ids (the file's own
vocabulary is the target's, or the row says it is not), one request at a
time, greedy (top-k 1, no repetition penalty), EOS ignored, ``max_tokens``
new tokens, prefill included, medians of rounds. ``llama-cpp-python`` is a
benchmark dependency only (``pip install llama-cpp-python``, built from its
sdist); without it the rows say so instead of failing the bench.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from speculant.bench.report import median, rate, timing_fields


def missing_reason() -> str | None:
    """Why llama.cpp rows cannot run here (None: they can)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        return (f"skipped: llama-cpp-python is not installed ({exc}); pip install llama-cpp-python "
                "(a benchmark dependency, built from its sdist)")
    return None


def generate_alone(llm: Any, prompt: list[int], max_tokens: int) -> tuple[list[int], float, float, list[float]]:
    """One request alone: (tokens, seconds, time to first token, gaps after it)."""
    llm.reset()
    tokens: list[int] = []
    gaps: list[float] = []
    start = last = time.perf_counter()
    first = None
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        now = time.perf_counter()
        if first is None:
            first = now
        else:
            gaps.append(now - last)
        last = now
        tokens.append(int(tok))
        if len(tokens) >= max_tokens:  # EOS ignored: a fixed number of tokens, as the other rows
            break
    end = time.perf_counter()
    return tokens, end - start, (first or end) - start, gaps


def run_llamacpp(files: list[str], prompts: list[list[int]], *, max_tokens: int, repeats: int,
                 threads: int | None, log=print) -> list[dict[str, Any]]:
    """One batch-1 row per GGUF file in ``files``."""
    reason = missing_reason()
    rows: list[dict[str, Any]] = []
    for path in files:
        base = {"engine": "llama.cpp", "method": Path(path).name, "concurrency": 1,
                "acceptance_rate": None, "mean_accepted_length": None}
        if reason:
            rows.append({**base, "status": reason})
            continue
        from llama_cpp import Llama

        log(f"llama.cpp {Path(path).name} ...")
        try:
            llm = Llama(model_path=str(path), n_ctx=max(len(p) for p in prompts) + max_tokens + 8, n_batch=512,
                        n_threads=threads or os.cpu_count(), n_threads_batch=threads or os.cpu_count(),
                        verbose=False, logits_all=False)
        except Exception as exc:  # noqa: BLE001 - a file llama.cpp cannot load is a row, not a crash
            rows.append({**base, "status": f"error: {type(exc).__name__}: {exc}"})
            continue
        if llm.n_vocab() < max(max(p) for p in prompts) + 1:
            rows.append({**base, "status": f"error: {path}'s vocabulary ({llm.n_vocab()}) is not the target's"})
            continue
        generate_alone(llm, prompts[0][::-1], 4)  # untimed warm-up on a prompt outside the timed set
        rates, decode_rates, ttfts, gaps, token_ids = [], [], [], [], []
        for _ in range(repeats):
            runs = [generate_alone(llm, p, max_tokens) for p in prompts]
            token_ids = [r[0] for r in runs]
            n = sum(len(t) for t in token_ids)
            rates.append(rate(n, sum(r[1] for r in runs)))
            decode_rates.append(rate(n - len(runs), sum(r[1] - r[2] for r in runs)))
            ttfts += [r[2] for r in runs]
            gaps += [g for r in runs for g in r[3]]
        rows.append({**base, "status": "ok", "num_requests": len(prompts), "num_tokens": sum(map(len, token_ids)),
                     "tokens_per_s": median(rates), "tokens_per_s_samples": [round(r, 2) for r in rates],
                     **timing_fields(decode_rates, ttfts, gaps), "token_ids": token_ids})
        del llm
    return rows
