"""transformers side of ``speculant bench``: plain ``generate()``, assisted
generation (``assistant_model=``), prompt lookup (``prompt_lookup_num_tokens=``)
and continuous batching (``generate_batch``), greedy with EOS ignored
(``eos_token_id = -1``: EOS is an ordinary token, as with Speculant's
``ignore_eos``; transformers logs a warning about it, which is silenced here).

At concurrency 1 each prompt runs alone and a streamer times every token the
model emits (ITL as on the Speculant side: a burst of n tokens counts as n
gaps of ``dt / n``; the first token is excluded). At concurrency > 1 two
batched rows are measured (not in ``--quick``): ``generate`` over one static
left-padded batch, and ``continuous_batching`` (``speculant.bench.hf_cb``; no
row at concurrency 1, where it would be ``generate`` alone). Assisted
generation and prompt lookup run at batch size 1 only. What transformers
cannot do is recorded as ``status: "unsupported: <reason>"``; a row whose run
raised is ``status: "error: <type>: <message>"`` (a failure, not a missing
feature).
"""

from __future__ import annotations

import time
from typing import Any

from speculant.bench.hf_cb import CBUnsupported, run_continuous_batching
from speculant.bench.report import gpu_peak_gb, gpu_peak_reset, median, rate, timing_fields

BATCHED_ONLY = ("continuous_batching",)  # methods with rows at concurrency > 1 only


class _TimingStreamer:
    """Records when generated tokens arrive (``generate`` calls ``put`` with the
    prompt first, then with each new token or burst of accepted tokens)."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.gaps: list[float] = []
        self.count = 0
        self.last = time.perf_counter()
        self.first_at: float | None = None  # when the first generated token arrived

    def put(self, value) -> None:
        now = time.perf_counter()
        if not self.prompt_seen:
            self.prompt_seen = True
            self.last = now
            return
        n = int(value.numel())
        if n <= 0:
            return
        if self.count > 0:
            self.gaps.extend([(now - self.last) / n] * n)
        else:
            self.first_at = now
            self.gaps.extend([(now - self.last) / n] * (n - 1))
        self.count += n
        self.last = now

    def end(self) -> None:
        pass


def _gen_kwargs(max_tokens: int, pad_id: int | None) -> dict[str, Any]:
    # eos_token_id = -1: EOS neither stops nor is masked, as Speculant's ignore_eos (min_new_tokens
    # would forbid EOS, and a chat model's greedy reply then parts from the engine's at its first EOS)
    return {"max_new_tokens": max_tokens, "eos_token_id": -1, "do_sample": False, "pad_token_id": pad_id}


def hf_methods(k: int, draft: str | None, confidence: float = 0.4) -> list[tuple[str, dict | None, str | None]]:
    """(method, extra generate kwargs or None, skip reason). ``confidence`` is
    assisted generation's ``assistant_confidence_threshold`` (0 turns it off)."""
    rows: list[tuple[str, dict | None, str | None]] = [("generate", {}, None)]
    if draft is None:
        rows.append(("assisted", None, "skipped: no --draft given"))
    else:
        rows.append(("assisted", {"assistant": True, "num_assistant_tokens": k,
                                  "num_assistant_tokens_schedule": "constant",
                                  "assistant_confidence_threshold": confidence}, None))
    rows.append(("prompt_lookup", {"prompt_lookup_num_tokens": k}, None))
    rows.append(("continuous_batching", {}, None))
    return rows


def _load(path: str, dtype: str, device: str = "cpu", random_seed: int | None = None):
    """transformers' model from ``path``; with ``random_seed``, built from its
    config.json with that seed on ``device``, as Speculant's ``load_format =
    "dummy"`` does (so both engines hold the same random weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model: Any  # transformers types .to with an unbound self, so a typed model would need an ignore
    if random_seed is not None:
        torch.manual_seed(random_seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=getattr(torch, dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    model.to(device).eval()
    return model


def _sync(model) -> None:
    """Wait for the device's queued work, so a timer read after it counts it."""
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize()


def _run_bs1(model, prompts, max_tokens, repeats, pad_id, extra) -> dict[str, Any]:
    import torch

    rates: list[float] = []
    decode_rates: list[float] = []
    ttfts: list[float] = []
    gaps: list[float] = []
    token_ids: list[list[int]] = []
    num_tokens = 0
    for rep in range(repeats + 1):  # the first pass is an untimed warm-up
        total_t = decode_t = 0.0
        token_ids = []
        for p in (prompts[:1] if rep == 0 else prompts):
            ids = torch.tensor([p], device=model.device)
            streamer = _TimingStreamer()
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), streamer=streamer,
                                     **_gen_kwargs(max_tokens, pad_id), **extra)
            _sync(model)
            end = time.perf_counter()
            total_t += end - t0
            first = streamer.first_at or end
            decode_t += end - first
            token_ids.append(out[0, ids.shape[1]:].tolist())
            if rep > 0:
                gaps.extend(streamer.gaps)
                ttfts.append(first - t0)
        if rep > 0:
            num_tokens = sum(len(t) for t in token_ids)
            rates.append(rate(num_tokens, total_t))
            decode_rates.append(rate(num_tokens - len(token_ids), decode_t))
    return {"num_requests": len(prompts), "num_tokens": num_tokens, "tokens_per_s": median(rates),
            "tokens_per_s_samples": [round(r, 2) for r in rates], **timing_fields(decode_rates, ttfts, gaps),
            "token_ids": token_ids}


def _run_batched(model, requests, max_tokens, repeats, pad_id) -> dict[str, Any]:
    """Plain ``generate()`` over one left-padded batch."""
    import torch

    width = max(len(p) for p in requests)
    pad = pad_id if pad_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in requests], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in requests], device=model.device)
    rates, token_ids = [], []
    with torch.no_grad():  # untimed warm-up: the whole batch, a few tokens
        model.generate(ids, attention_mask=mask, **_gen_kwargs(min(4, max_tokens), pad_id))
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, **_gen_kwargs(max_tokens, pad_id))
        _sync(model)
        secs = time.perf_counter() - t0
        token_ids = out[:, width:].tolist()
        rates.append(sum(len(t) for t in token_ids) / secs)
    return {"num_requests": len(requests), "num_tokens": sum(len(t) for t in token_ids),
            "tokens_per_s": median(rates), "tokens_per_s_samples": [round(r, 2) for r in rates],
            "itl_p50_ms": None, "itl_p99_ms": None, "token_ids": token_ids,
            "note": "static left-padded batch (generate())"}


def _unsupported_batched(method: str) -> str:
    if method == "assisted":
        return ("unsupported: assisted generation runs at batch size 1 only, and continuous batching "
                "(generate_batch) refuses an assistant model")
    return "unsupported: prompt lookup decoding runs at batch size 1 only"


def run_hf(target: str, draft: str | None, prompts: list[list[int]], *, max_tokens: int, k: int, repeats: int,
           concurrency: list[int], batched: bool, pad_id: int | None, max_batch_tokens: int = 512,
           confidence: float = 0.4, dtype: str = "float32", device: str = "cpu", log=print,
           methods: tuple[str, ...] | None = None, random_seed: int | None = None) -> list[dict[str, Any]]:
    """transformers rows; ``max_batch_tokens`` is the continuous-batching step budget,
    ``confidence`` assisted generation's confidence threshold, ``dtype`` / ``device`` both models';
    ``methods`` keeps only those rows; ``random_seed`` builds the target with seeded random weights."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the eos_token_id = -1 warning, once per generate() call
    try:
        return _run_rows(target, draft, prompts, max_tokens=max_tokens, k=k, repeats=repeats,
                         concurrency=concurrency, batched=batched, pad_id=pad_id,
                         max_batch_tokens=max_batch_tokens, confidence=confidence, dtype=dtype, device=device,
                         log=log, methods=methods, random_seed=random_seed)
    finally:
        hf_logging.set_verbosity(verbosity)


def _run_rows(target: str, draft: str | None, prompts: list[list[int]], *, max_tokens: int, k: int, repeats: int,
              concurrency: list[int], batched: bool, pad_id: int | None, max_batch_tokens: int,
              confidence: float, dtype: str, device: str, log, methods: tuple[str, ...] | None,
              random_seed: int | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base = {"engine": "transformers", "acceptance_rate": None, "mean_accepted_length": None}
    model = _load(target, dtype, device, random_seed)
    assistant = _load(draft, dtype, device) if draft is not None else None
    for method, extra, skip in hf_methods(k, draft, confidence):
        if methods is not None and method not in methods:
            continue
        for c in concurrency:
            if c <= 1 and method in BATCHED_ONLY:
                continue
            row = {**base, "method": method, "concurrency": c}
            if skip:
                rows.append({**row, "status": skip})
                continue
            if c > 1 and method in ("assisted", "prompt_lookup"):
                rows.append({**row, "status": _unsupported_batched(method)})
                continue
            if c > 1 and not batched:
                rows.append({**row, "status": "skipped: batched transformers rows are off in --quick"})
                continue
            log(f"transformers {method} concurrency={c} ...")
            requests = [prompts[i % len(prompts)] for i in range(c)]
            gpu_peak_reset(device)
            try:
                if c <= 1:
                    kw = dict(extra or {})  # None only for skipped methods
                    if kw.pop("assistant", False):
                        kw["assistant_model"] = assistant
                    res = _run_bs1(model, prompts, max_tokens, repeats, pad_id, kw)
                elif method == "continuous_batching":
                    res = run_continuous_batching(model, requests, max_tokens, repeats, max_batch_tokens, pad_id)
                else:
                    res = _run_batched(model, requests, max_tokens, repeats, pad_id)
                rows.append({**row, "status": "ok", **res, "peak_gpu_memory_gb": gpu_peak_gb(device)})
            except CBUnsupported as exc:
                rows.append({**row, "status": f"unsupported: {exc}"})
            except Exception as exc:  # noqa: BLE001 - record, do not crash the bench
                rows.append({**row, "status": f"error: {type(exc).__name__}: {exc}"})
    return rows
