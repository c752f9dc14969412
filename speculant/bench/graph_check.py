"""GPU check of CUDA graphs: greedy output with ``model.cuda_graphs = "auto"``
equals ``"off"``, and ms per batch-1 decode step both ways.

``python -m speculant.bench.graph_check --json graph_check.json`` builds a
SmolLM2-135M-shaped llama from a config alone (``model.load_format =
"dummy"``, the word-level tokenizer of ``random_target``; nothing read but the
repository), then per dtype (float32, bfloat16) runs mixed batches (prompts of
1-61 tokens chunked next to decodes) without and with speculation (n-gram
verify runs), once eagerly and once graphed, on the ``triton`` backend.

Tokens must be identical. Where they differ, the first differing position
is judged on the eager run's log-probabilities there: a gap between the two
tokens below ``--tie-gap`` is a near tie (GEMMs over a padded token count
may round differently; reported, not failed), anything else fails. Exit 0:
all equal or near ties, graphs replayed and no capture failed; 1: a real
difference or graphs unused; 2: no CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from speculant import LLM, SamplingParams
from speculant.bench import random_target
from speculant.bench.report import environment
from speculant.model import cuda_graphs

MAX_TOKENS = 32
SHAPE_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
              "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True}


def prompts(vocab: int) -> list[list[int]]:
    mixed = [random_target.random_prompts(vocab, 1, n, seed=n)[0] for n in (1, 5, 17, 33, 61)]
    pattern = random_target.random_prompts(vocab, 1, 7, seed=99)[0]
    return mixed + [pattern * 6]  # the repeated one gives the n-gram proposer matches


def build(size: str, out: Path) -> Path:
    if size == "135m":
        random_target.SIZES.setdefault("135m", SHAPE_135M)
    return random_target.build_random_target(size, out)


def make_llm(target: Path, dtype: str, graphs: str, spec: bool, device: str):
    kw: dict[str, Any] = dict(load_format="dummy", dtype=dtype, device=device, cuda_graphs=graphs,
                              attention_backend="triton" if device == "cuda" else "auto", max_model_len=512,
                              block_size=16, max_num_batched_tokens=128, max_num_seqs=8, kv_cache_memory_gb=0.25)
    if spec:
        kw["speculative"] = dict(proposer="ngram", scorer="mqa", num_speculative_tokens=4)
    return LLM(str(target), **kw)


def decode_ms(llm, prompt: list[int], steps: int = 32) -> float:
    """ms per batch-1 decode step: (generate 1 + steps tokens - generate 1 token) / steps, best of 3."""
    def timed(n: int) -> float:
        start = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - start

    timed(1 + steps)  # warm-up: kernels compiled, graphs captured
    return min((timed(1 + steps) - timed(1)) / steps * 1e3 for _ in range(3))


def greedy(llm, batch: list[list[int]], logprobs: int | None = None) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=logprobs)
    return [o.outputs[0] for o in llm.generate(batch, params, use_tqdm=False)]


def judge(eager_llm, batch, eager: list[list[int]], graphed: list[list[int]], tie_gap: float) -> list[dict]:
    """The first difference of each prompt whose outputs differ, with the eager log-prob gap there."""
    out = []
    for i, (a, b) in enumerate(zip(eager, graphed)):
        if a == b:
            continue
        j = next((p for p, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        gap = None
        if j < min(len(a), len(b)):
            lp = eager_llm.generate([batch[i] + a[:j]], SamplingParams(temperature=0.0, max_tokens=1, logprobs=20),
                                    use_tqdm=False)[0].outputs[0].logprobs[0]
            gap = lp[a[j]] - lp[b[j]] if b[j] in lp else float("inf")
        out.append({"prompt": i, "position": j, "eager_token": a[j] if j < len(a) else None,
                    "graphed_token": b[j] if j < len(b) else None, "logprob_gap": gap,
                    "near_tie": gap is not None and gap <= tie_gap})
    return out


def run_pair(target: Path, dtype: str, spec: bool, device: str, batch, tie_gap: float, log) -> dict:
    row: dict[str, Any] = {"dtype": dtype, "speculation": "ngram" if spec else "none"}
    eager_llm = make_llm(target, dtype, "off", spec, device)
    eager = [o.token_ids for o in greedy(eager_llm, batch)]
    row["eager_ms_per_decode_step"] = decode_ms(eager_llm, batch[2])
    graph_llm = make_llm(target, dtype, "auto", spec, device)
    graphs = graph_llm.engine.runner.graphs
    row["graphs_off_reason"] = graph_llm.engine.runner.graphs_off_reason
    graphed = [o.token_ids for o in greedy(graph_llm, batch)]
    row["graphed_ms_per_decode_step"] = decode_ms(graph_llm, batch[2])
    row["graph_keys"] = sorted(graphs.graphs) if graphs else []
    row["replays"] = graphs.replays if graphs else 0
    row["eager_runs"] = graphs.eager_runs if graphs else 0
    row["capture_failures"] = {str(k): v for k, v in graphs.failed.items()} if graphs else {}
    row["differences"] = judge(eager_llm, batch, eager, graphed, tie_gap)
    row["identical"] = not row["differences"]
    row["ok"] = (all(d["near_tie"] for d in row["differences"]) and row["replays"] > 0
                 and not row["capture_failures"])
    if spec:
        row["num_draft_tokens"] = graph_llm.get_metrics()["num_draft_tokens"]
    log(f"  {dtype:9s} spec={row['speculation']:5s} identical={row['identical']!s:5s} ok={row['ok']!s:5s} "
        f"eager {row['eager_ms_per_decode_step']:.2f} ms/step, graphed {row['graphed_ms_per_decode_step']:.2f} "
        f"ms/step, {len(row['graph_keys'])} graphs, {row['replays']} replays, {row['eager_runs']} eager forwards")
    for d in row["differences"]:
        log(f"    differs: {d}")
    for k, v in row["capture_failures"].items():
        log(f"    capture failed {k}: {v}")
    if row["graphs_off_reason"]:
        log(f"    graphs off: {row['graphs_off_reason']}")
    del eager_llm, graph_llm
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--size", default="135m", choices=["135m", "tiny"])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke test of this script (graphs resolve to eager there)")
    ap.add_argument("--stub-graphs", action="store_true",
                    help="replace capture by a stub that re-runs the forward (CPU smoke test of the graphed path)")
    ap.add_argument("--tie-gap", type=float, default=1e-3, help="largest eager log-prob gap called a near tie")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("graph_check: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU machine",
              file=sys.stderr)
        return 2
    if args.stub_graphs:
        cuda_graphs.resolve = lambda setting, device, backend: (
            "model.cuda_graphs = 'off'" if setting == "off" else (cuda_graphs.StubGraph, None))
    started = time.perf_counter()
    result: dict[str, Any] = {"size": args.size, "device": args.device, "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
                              "environment": environment(), "rows": []}
    with tempfile.TemporaryDirectory(prefix="speculant-graph-check-") as tmp:
        target = build(args.size, Path(tmp) / f"llama-{args.size}")
        vocab = json.loads((target / "config.json").read_text())["vocab_size"]
        batch = prompts(vocab)
        print(f"graph_check: {args.size} dummy llama on {args.device}, {len(batch)} prompts, {MAX_TOKENS} tokens")
        for dtype in args.dtypes.split(","):
            for spec in (False, True):
                try:
                    result["rows"].append(run_pair(target, dtype, spec, args.device, batch, args.tie_gap, print))
                except Exception as exc:  # noqa: BLE001 - reported per row; the check fails
                    print(f"  {dtype} spec={spec}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)
                    result["rows"].append({"dtype": dtype, "speculation": "ngram" if spec else "none", "ok": False,
                                           "error": f"{type(exc).__name__}: {exc}"})
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["ok"] = all(r["ok"] for r in result["rows"])
    Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    print(f"graph_check: {'OK' if result['ok'] else 'FAILED'} in {result['seconds']} s; wrote {args.json}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
