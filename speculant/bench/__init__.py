"""``speculant bench``: Speculant vs transformers on one local model pair.

Same prompts (tokenized once with the target's tokenizer, raw or rendered
with its chat template, so both sides see identical token ids), greedy, EOS
ignored, one dtype for both engines. Each row reports median tokens/s over
repeats (end to end, and decode-only with TTFT at concurrency 1), the
fraction of the memory-bandwidth bound (``bandwidth``), acceptance rate and
mean accepted length (Speculant rows with speculation), p50/p99 inter-token
latency (concurrency 1 only) and whether its greedy tokens equal the
Speculant no-speculation run at the same concurrency. Repeats run in rounds:
every row once per round (``report.merge_repeats`` joins them), so a burst of
load from other jobs costs every row alike instead of the ones it hit.

Rows (``engine``/``method``):

* speculant: ``no_spec``, ``ngram``, ``draft_mqa``, ``draft_batch_expansion``
  (with a draft), ``medusa`` / ``mlp_speculator`` (with trained heads for the
  target; chunked prefill off, ``k`` capped to the heads' count);
* transformers: ``generate`` (batch 1; at concurrency > 1 a static
  left-padded batch), ``assisted`` and ``prompt_lookup`` (batch 1 only),
  ``continuous_batching`` (concurrency > 1 only, ``generate_batch``).

Modules: ``speculant_runs`` and ``heads`` (Speculant rows), ``hf_runs`` and
``hf_cb`` (transformers rows), ``bandwidth`` (the memory-bandwidth bound),
``report`` (statistics, JSON, Markdown) and ``chart`` (PNG).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import torch

from speculant.bench.bandwidth import bound_tokens_per_s, model_decode_bytes, read_bandwidth
from speculant.bench.heads import head_methods
from speculant.bench.hf_runs import run_hf
from speculant.bench.llamacpp import run_llamacpp
from speculant.bench.report import drop_raw, environment, merge_repeats
from speculant.bench.speculant_runs import run_speculant, speculant_methods
from speculant.config.models import SchedulerConfig
from speculant.model.loading.gguf_source import resolve_model_source

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "import os\n\n\ndef list_files(path):\n    \"\"\"Return every file under path.\"\"\"\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n    else:\n",
    "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n    parser.add_argument(",
    "with open(filename) as f:\n    for line in f:\n        line = line.strip()\n",
    "try:\n    value = int(text)\nexcept ValueError:\n",
    "def merge(a, b):\n    result = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n",
)



class QuickSettings(TypedDict):
    max_tokens: int
    num_prompts: int
    repeats: int
    concurrency: list[int]
    hf_batched: bool


QUICK: QuickSettings = {"max_tokens": 8, "num_prompts": 2, "repeats": 1, "concurrency": [1], "hf_batched": False}

ITL_NOTE = ("ITL: per generated token after the first, at concurrency 1; a step (or generate() "
            "callback) that emits n tokens counts as n gaps of step_time / n. Null at concurrency > 1.")


def render_prompts(tok, texts: list[str], chat: bool) -> list[list[int]]:
    """Token ids of each prompt: raw text, or (``chat``) one user message rendered
    with the model's chat template and the assistant turn opened."""
    if not chat:
        return [tok(p, add_special_tokens=True)["input_ids"] for p in texts]
    if not getattr(tok, "chat_template", None):
        raise ValueError("--chat: the target's tokenizer has no chat template; drop --chat to benchmark raw "
                         "prompts, or use a chat model")
    return [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]) for p in texts]


def add_bound(rows: list[dict[str, Any]], bound: float) -> None:
    """``bound_fraction``: batch-1 decode-only tokens/s over the memory-bandwidth
    bound (speculative rows may exceed 1: they verify several tokens per weight read)."""
    for r in rows:
        tps = r.get("decode_tokens_per_s")
        r["bound_fraction"] = tps / bound if tps and r.get("concurrency") == 1 and bound > 0 else None


def load_prompts(path: str | None) -> list[str]:
    if path is None:
        return list(DEFAULT_PROMPTS)
    prompts = [line.rstrip("\n").replace("\\n", "\n") for line in Path(path).read_text().splitlines()]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise ValueError(f"{path}: no prompts (one per line)")
    return prompts


def _mark_matches(rows: list[dict[str, Any]]) -> None:
    """``matches_no_spec``: greedy tokens equal the Speculant no-spec row's."""
    truth = {r["concurrency"]: r["token_ids"] for r in rows
             if r["engine"] == "speculant" and r["method"] == "no_spec" and r.get("status") == "ok"}
    for r in rows:
        ref = truth.get(r["concurrency"])
        r["matches_no_spec"] = (r["token_ids"] == ref) if ref is not None and "token_ids" in r else None


def _bound_note(bound: float | None, bandwidth: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    if bound is None:
        return "no memory-bandwidth bound: it is measured for the CPU only"
    best = max(b["best_gb_s"] for b in bandwidth)
    return (f"of bound: decode tok/s / memory-bandwidth bound ({bound:.1f} tok/s = best read bandwidth "
            f"{best:.1f} GB/s / {facts['weight_bytes_per_decode_step'] / 1e6:.0f} MB of weights read per "
            f"{facts['dtype']} decode step); speculative rows can exceed 1.")


def run_bench(target: str, draft: str | None = None, *, prompts: list[str] | None = None, max_tokens: int = 64,
              k: int = 4, repeats: int = 3, concurrency: list[int] | None = None, hf: bool = True,
              hf_batched: bool = True, heads: dict[str, str] | None = None, confidence: float = 0.4,
              dtype: str = "float32", chat: bool = False, device: str = "cpu", llamacpp: list[str] | None = None,
              threads: int | None = None, log=print) -> dict[str, Any]:
    """Run every row; ``target`` / ``draft`` are model directories or GGUF files
    (converted once, cached), loaded in ``dtype`` by both engines; ``heads`` maps
    ``medusa`` / ``mlp_speculator`` to trained head directories. Raises
    ``ValueError`` (naming the option) for bad heads or ``--chat`` without a template.
    Both engines run on ``device``; the memory-bandwidth bound is the CPU's, so
    on CUDA it is left out. ``llamacpp`` lists GGUF files run by llama.cpp (a
    batch-1 row each, ``threads`` threads)."""
    from transformers import AutoTokenizer

    concurrency = concurrency or [1, 32]
    target_dir = resolve_model_source(str(target), None, dtype, option="--target")
    draft_dir = resolve_model_source(str(draft), None, dtype, option="--draft") if draft else None
    tok = AutoTokenizer.from_pretrained(target_dir)
    texts = list(prompts or DEFAULT_PROMPTS)
    ids = render_prompts(tok, texts, chat)
    methods = speculant_methods(k, draft_dir, confidence) + head_methods(heads, target_dir, k,
                                                                         max(len(p) for p in ids), confidence)
    env = environment()
    on_cpu = device == "cpu"
    bandwidth = [read_bandwidth()] if on_cpu else []
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    runs = []
    for rep in range(repeats):  # every row once per round, so load from other jobs hits all rows alike
        log(f"round {rep + 1} of {repeats}")
        run = run_speculant(target_dir, methods, ids, max_tokens=max_tokens, repeats=1,
                            concurrency=concurrency, dtype=dtype, device=device, log=log)
        if hf:
            run += run_hf(target_dir, draft_dir, ids, max_tokens=max_tokens, k=k, repeats=1,
                          concurrency=concurrency, batched=hf_batched, pad_id=pad,
                          max_batch_tokens=SchedulerConfig().max_num_batched_tokens, confidence=confidence,
                          dtype=dtype, device=device, log=log)
        if llamacpp:
            run += run_llamacpp(llamacpp, ids, max_tokens=max_tokens, repeats=1, threads=threads, log=log)
        runs.append(run)
    rows = merge_repeats(runs)
    _mark_matches(rows)
    drop_raw(rows)
    facts = model_decode_bytes(target_dir, getattr(torch, dtype))
    bound = None
    if on_cpu:
        bandwidth.append(read_bandwidth())
        best = max(b["best_gb_s"] for b in bandwidth)
        bound = bound_tokens_per_s(facts["weight_bytes_per_decode_step"], best)
        add_bound(rows, bound)
    env["load_avg_end"] = environment()["load_avg"]
    return {
        "env": env,
        "model": {**facts, "read_bandwidth_gb_s": bandwidth, "bound_decode_tokens_per_s": bound},
        "settings": {"target": str(target), "draft": str(draft) if draft else None, "dtype": dtype, "chat": chat,
                     "device": device,
                     "max_tokens": max_tokens, "k": k, "draft_confidence": confidence, "repeats": repeats,
                     "concurrency": concurrency, "num_prompts": len(texts),
                     "greedy": True, "ignore_eos": True, "hf_batched": hf_batched,
                     "medusa": (heads or {}).get("medusa"), "mlp_speculator": (heads or {}).get("mlp_speculator"),
                     "eagle": (heads or {}).get("eagle"), "llamacpp": llamacpp or []},
        "notes": [ITL_NOTE,
                  "tokens/s: generated tokens / wall time (prefill included), median over repeats; the repeats run "
                  "in rounds (every row once per round), so load from other jobs hits all rows alike.",
                  "decode tok/s: tokens after the first / time after the first token (batch 1 only); TTFT: time "
                  "to the first token.",
                  _bound_note(bound, bandwidth, facts)],
        "prompts": texts,
        "rows": rows,
    }
