"""Speculant side of ``speculant bench``: one engine per method, timed runs.

At concurrency 1 each prompt runs alone through the LLM's engine loop
(``EngineLoop.stream``), so every step is timed. Inter-token latency (ITL) is per generated
token after the first: a step that emits n tokens (speculation emits bursts)
counts as n gaps of ``step_time / n``. The first token (time to first token,
prefill) is excluded from ITL and from the decode-only rate (tokens after the
first / time after the first), and reported as TTFT. At higher concurrency
requests go through ``LLM.generate`` at once and only throughput is reported
(ITL, TTFT and decode-only rate are null).

Methods: ``no_spec``, ``ngram``, ``suffix``, ``suffix_adaptive`` (suffix with the
adaptive draft-length policy: k per request follows its acceptance, total drafts follow
the batch size), ``draft_mqa`` / ``draft_batch_expansion`` / ``draft_suffix`` (with
``--draft``) and, with trained head directories, ``medusa`` / ``mlp_speculator`` /
``eagle`` (built in ``speculant.bench.heads``: MQA scoring, chunked prefill off only for
a proposer that cannot run under it). Each method is one engine, reused across concurrency levels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from speculant.bench.report import gpu_peak_gb, gpu_peak_reset, median, rate, timing_fields
from speculant.config.sampling_params import SamplingParams

ADAPTIVE = {"policy": "adaptive"}  # speculative.draft_length of the ``*_adaptive`` rows (default cost model)
FIXED = {"policy": "fixed"}  # the other rows: every decode gets k (the engine's default is adaptive)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


@dataclass
class Method:
    """One Speculant row kind: name, speculative config (None: no speculation),
    skip reason, extra ``LLM(...)`` keywords, a note and extra fields for its rows."""

    name: str
    speculative: dict | None = None
    skip: str | None = None
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    note: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def speculant_methods(k: int, draft: str | None, confidence: float = 0.4) -> list[Method]:
    """No speculation, ngram, suffix (fixed k and adaptive), the two draft-model scorers
    and the draft behind suffix decoding (``draft_suffix``; skipped without a draft);
    ``confidence`` is the draft's ``confidence_threshold``."""
    suffix = {"proposer": "suffix", "num_speculative_tokens": k}
    methods = [Method("no_spec"),
               Method("ngram", {"proposer": "ngram", "num_speculative_tokens": k, "draft_length": FIXED}),
               Method("suffix", {**suffix, "draft_length": FIXED}),
               Method("suffix_adaptive", {**suffix, "draft_length": ADAPTIVE})]
    for scorer in ("mqa", "batch_expansion"):
        name = f"draft_{scorer}"
        if draft is None:
            methods.append(Method(name, skip="skipped: no --draft given"))
        else:
            options = {"model": str(draft), "confidence_threshold": confidence}
            methods.append(Method(name, {"proposer": "draft_model", "num_speculative_tokens": k, "scorer": scorer,
                                         "proposer_options": options, "draft_length": FIXED}))
    if draft is None:
        methods.append(Method("draft_suffix", skip="skipped: no --draft given"))
    else:
        hybrid = {"draft": {"model": str(draft), "confidence_threshold": confidence}}
        methods.append(Method("draft_suffix", {"proposer": "draft_suffix", "num_speculative_tokens": k,
                                               "proposer_options": hybrid, "draft_length": FIXED}))
    return methods


def build_llm(target: str, method: Method, max_seqs: int, dtype: str = "float32", device: str = "cpu",
              **extra: Any):
    from speculant.llm import LLM

    # prefix caching off: repeats, and the concurrency rows, run the same prompts again (the
    # 32-request rows repeat each prompt to fill the batch), so caching would time cache hits
    kw: dict[str, Any] = {"max_num_seqs": max(1, max_seqs), "seed": 0, "dtype": dtype, "device": device,
                          "enable_prefix_caching": False, **method.engine_kwargs, **extra}
    if method.speculative:
        kw["speculative"] = method.speculative
    return LLM(model=str(target), **kw)


@dataclass
class Timed:
    """One request run alone: its tokens, total seconds, seconds to the first
    token, and the per-token gaps after it."""

    tokens: list[int]
    seconds: float
    ttft: float
    gaps: list[float]


def _stream_one(loop, prompt: list[int], max_tokens: int) -> Timed:
    """Run one prompt alone, step by step (``loop``: the LLM's ``EngineLoop``)."""
    gaps: list[float] = []
    seen = 0
    tokens: list[int] = []
    first = None
    start = last = time.perf_counter()
    for o in loop.stream(prompt, greedy(max_tokens)):
        now = time.perf_counter()
        tokens = o.outputs[0].token_ids
        n = len(tokens) - seen
        if n > 0:
            if seen > 0:  # gaps after the first token only
                gaps.extend([(now - last) / n] * n)
            else:
                first = now
                gaps.extend([(now - last) / n] * (n - 1))  # a burst along with the first token
            seen = len(tokens)
            last = now
    end = time.perf_counter()
    return Timed(list(tokens), end - start, (first or end) - start, gaps)


def warm_up_prompt(prompts: list[list[int]]) -> list[int]:
    """A prompt outside the measured set (the first one reversed, lengthened while
    it equals one of them), so the untimed warm-up leaves nothing a proposer with
    memory across requests (``suffix``'s global cache) could replay in a timed run."""
    warm = prompts[0][::-1]
    while warm in prompts:
        warm = warm + warm[:1]
    return warm


def _warm_up(llm, prompts: list[list[int]]) -> None:
    """One short untimed run so one-time setup is not counted as speed."""
    llm.generate([warm_up_prompt(prompts)], greedy(4), use_tqdm=False)
    llm.engine.reset_metrics()


def run_method(llm, prompts: list[list[int]], max_tokens: int, concurrency: int,
               repeats: int) -> dict[str, Any]:
    """Time ``repeats`` runs of the prompts at one concurrency; returns row fields
    and ``token_ids`` (one list per request, in order)."""
    _warm_up(llm, prompts)
    rates: list[float] = []
    decode_rates: list[float] = []
    ttfts: list[float] = []
    gaps: list[float] = []
    token_ids: list[list[int]] = []
    num_tokens = 0
    if concurrency <= 1:
        for _ in range(repeats):
            runs = [_stream_one(llm.loop, p, max_tokens) for p in prompts]
            token_ids = [r.tokens for r in runs]
            num_tokens = sum(len(r.tokens) for r in runs)
            rates.append(rate(num_tokens, sum(r.seconds for r in runs)))
            decode_rates.append(rate(sum(len(r.tokens) - 1 for r in runs), sum(r.seconds - r.ttft for r in runs)))
            ttfts.extend(r.ttft for r in runs)
            gaps.extend(g for r in runs for g in r.gaps)
        requests = prompts
    else:
        requests = [prompts[i % len(prompts)] for i in range(concurrency)]
        for _ in range(repeats):
            outs = llm.generate(requests, greedy(max_tokens), use_tqdm=False)
            token_ids = [list(o.outputs[0].token_ids) for o in outs]
            num_tokens = sum(len(t) for t in token_ids)
            rates.append(rate(num_tokens, llm.last_run_seconds))
    metrics = llm.get_metrics()
    spec = llm.config.speculative.enabled
    return {
        "num_requests": len(requests),
        "num_tokens": num_tokens,
        "tokens_per_s": median(rates),
        "tokens_per_s_samples": [round(r, 2) for r in rates],
        **timing_fields(decode_rates, ttfts, gaps),
        "acceptance_rate": metrics.get("acceptance_rate") if spec else None,
        "mean_accepted_length": metrics.get("mean_accepted_length") if spec else None,
        "mean_planned_draft_length": metrics.get("mean_planned_draft_length") if spec else None,
        "accepted_length_histogram": metrics.get("accepted_length_histogram") if spec else None,
        "prefix_caching": metrics.get("prefix_caching"),
        "prefix_cache_hit_rate": metrics.get("prefix_cache_hit_rate"),
        "token_ids": token_ids,
    }


def run_speculant(target: str, methods: list[Method], prompts: list[list[int]], *, max_tokens: int,
                  repeats: int, concurrency: list[int], dtype: str = "float32", device: str = "cpu",
                  log=print, **llm_kwargs: Any) -> list[dict[str, Any]]:
    """One row per method and concurrency level; a method that fails is an ``error:`` row.
    ``llm_kwargs`` go to every ``LLM`` (``load_format="dummy"`` for random targets)."""
    rows: list[dict[str, Any]] = []
    for m in methods:
        base = {"engine": "speculant", "method": m.name, **m.fields}
        if m.note:
            base["note"] = m.note
        if m.skip:
            rows += [{**base, "concurrency": c, "status": m.skip} for c in concurrency]
            continue
        gpu_peak_reset(device)
        llm = build_llm(target, m, max(concurrency), dtype, device, **llm_kwargs)
        for c in concurrency:
            log(f"speculant {m.name} concurrency={c} ...")
            try:
                res = run_method(llm, prompts, max_tokens, c, repeats)
                rows.append({**base, "concurrency": c, "status": "ok", **res,
                             "peak_gpu_memory_gb": gpu_peak_gb(device)})
            except Exception as exc:  # noqa: BLE001 - a failing method is a row, not a crash
                rows.append({**base, "concurrency": c, "status": f"error: {type(exc).__name__}: {exc}"})
        del llm
    return rows
