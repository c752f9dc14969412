"""Speculant vs Hugging Face transformers on one CPU: decode speed, batch
throughput and the cost of multi-token forwards.

Model: the random ~134M-parameter Llama of ``benchmarks/bench_models.py`` (float32),
built once into the cache directory. Every comparison runs both sides in this
process, with the same torch thread count, interleaving their repetitions so
that load from other processes hits them alike. Figures are medians.

Sections (``--only`` picks some):

* ``decode``: batch-1 greedy decode, one prompt, ``max_new_tokens`` new tokens,
  EOS ignored. Speculant ``LLM.generate`` vs transformers ``generate()``.
  Decode-only speed comes from per-token timings (each ``engine.step()`` of
  Speculant; a streamer's timestamps for HF), first token (prefill) excluded:
  tokens/s = 1 / median seconds per token. The end-to-end rate and the
  "N tokens minus 1 token" rate are kept in the JSON too.
* ``throughput``: 32 requests of mixed prompt/output lengths, greedy, EOS
  ignored. Speculant ``LLM.generate`` vs transformers continuous batching
  (a ``continuous_batching_context_manager`` session, requests added with
  their own ``max_new_tokens``, as ``generate_batch`` does with one shared
  value) vs one left-padded ``generate()`` batch (runs every row to the longest
  output; only requested tokens count). Output tokens/s over wall time.
* ``forward``: one model forward of T = 1, 2, 5, 16 query tokens over a cached
  128-token prefix, logits at every query token (a speculative verify), through
  ``ModelRunner.forward`` with ``model.linear_backend`` = default and onednn,
  and HF's own forward with a ``DynamicCache`` (cropped back after each call).

Memory-bandwidth bound: bytes a decode step must read (every linear weight,
LM head included; one embedding row) / read bandwidth (best of the
measurements at the start and the end, all cores).

Usage::

    python benchmarks/bench_engine.py            # full run, ~5 min on a quiet 2-core machine
    python benchmarks/bench_engine.py --quick    # smoke test, tiny model, < 1 min
    python benchmarks/bench_engine.py --threads 1 --only decode,forward
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import bench_models
import harness
from harness import CLOCKS, log, since, stamp, summary

FULL = dict(model="bench", decode_prompt=64, decode_tokens=128, decode_reps=3,
            num_requests=32, prompt_range=(16, 256), output_range=(16, 128), throughput_reps=2,
            prefix=128, query_tokens=(1, 2, 5, 16), forward_reps=10, bandwidth_bytes=1 << 30)
QUICK = dict(model="quick", decode_prompt=16, decode_tokens=16, decode_reps=2,
             num_requests=8, prompt_range=(8, 48), output_range=(4, 16), throughput_reps=1,
             prefix=32, query_tokens=(1, 2, 5, 16), forward_reps=5, bandwidth_bytes=1 << 28)

TARGETS = {
    "decode_speedup": 1.5,  # Speculant batch-1 decode tokens/s >= 1.5x HF generate()
    "forward_5_over_1": 1.3,  # engine's 5-token forward <= 1.3x its 1-token forward
    "throughput_speedup": 1.5,  # Speculant 32-request throughput >= 1.5x HF's best
}


# --- models ----------------------------------------------------------------------
def load_hf(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # ignore EOS without a logits processor
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def load_speculant(model_dir: Path, **overrides):
    from speculant import LLM

    # every round repeats the same prompts: prefix caching would time cache hits, not prefill
    return LLM(model=str(model_dir), **{"enable_prefix_caching": False, **overrides})


def linear_backend_available() -> bool:
    try:
        import speculant.model.linear.backend  # noqa: F401
    except ImportError:
        return False
    return torch.backends.mkldnn.is_available()


class StepTimer:
    """Wraps ``llm.engine.step`` (an instance attribute; the class is untouched)
    to record the (wall, cpu) seconds of every step."""

    def __init__(self, llm) -> None:
        self.times: list[tuple[float, float]] = []
        self._llm = llm
        self._step = llm.engine.step
        llm.engine.step = self

    def __call__(self):
        t0 = stamp()
        out = self._step()
        self.times.append(since(t0))
        return out

    def remove(self) -> None:
        self._llm.engine.step = self._step


def hf_streamer():
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        """(wall, cpu) stamps of ``put`` calls: first the prompt, then every new token."""

        def __init__(self) -> None:
            self.stamps: list[tuple[float, float]] = []

        def put(self, value) -> None:
            self.stamps.append(stamp())

        def end(self) -> None:
            pass

    return Stamps()


def col(pairs: list[tuple[float, float]], clock: str) -> list[float]:
    i = CLOCKS.index(clock)
    return [p[i] for p in pairs]


def med(pairs: list[tuple[float, float]], clock: str) -> float:
    return statistics.median(col(pairs, clock))


# --- decode ----------------------------------------------------------------------
def bench_decode(cfg: dict, model_dir: Path, hf, tok, llm) -> dict[str, Any]:
    from speculant import SamplingParams

    prompt = bench_models.token_prompts(tok, [cfg["decode_prompt"]], seed=7)[0]
    n = cfg["decode_tokens"]
    x = torch.tensor([prompt])
    timer = StepTimer(llm)

    def run_speculant(num: int):
        timer.times.clear()
        params = SamplingParams(temperature=0.0, max_tokens=num, ignore_eos=True)
        t0 = stamp()
        out = llm.generate([prompt], params, use_tqdm=False)
        total = since(t0)
        ids = list(out[0].outputs[0].token_ids)
        assert len(ids) == num, f"speculant produced {len(ids)} tokens, asked for {num}"
        return total, list(timer.times), ids

    def run_hf(num: int):
        streamer = hf_streamer()
        t0 = stamp()
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=num,
                              streamer=streamer)
        total = since(t0)
        ids = out[0, len(prompt):].tolist()
        assert len(ids) == num, f"HF produced {len(ids)} tokens, asked for {num}"
        st = streamer.stamps  # prompt, then one per token
        return total, [(b[0] - a[0], b[1] - a[1]) for a, b in zip(st, st[1:])], ids

    runs: dict[str, dict[str, list]] = {s: {"total_n": [], "total_1": [], "per_token": [], "first": []}
                                        for s in ("speculant", "hf_generate")}
    ids: dict[str, list[int]] = {}
    fns = {"speculant": run_speculant, "hf_generate": run_hf}
    for fn in fns.values():  # warm-up both
        fn(4)
    for rep in range(cfg["decode_reps"]):
        for name, fn in fns.items():
            total, steps, ids[name] = fn(n)
            assert len(steps) == n, f"{name}: {len(steps)} step timings for {n} tokens"
            runs[name]["total_n"].append(total)
            runs[name]["first"].append(steps[0])
            runs[name]["per_token"].extend(steps[1:])
            runs[name]["total_1"].append(fn(1)[0])
        log(f"decode rep {rep + 1}/{cfg['decode_reps']}: speculant {runs['speculant']['total_n'][-1][0]:.2f}s, "
            f"hf {runs['hf_generate']['total_n'][-1][0]:.2f}s for {n} tokens")
    timer.remove()
    out: dict[str, Any] = {"prompt_tokens": len(prompt), "new_tokens": n, "reps": cfg["decode_reps"]}
    for name, r in runs.items():
        out[name] = {}
        for clock in CLOCKS:
            per_tok = med(r["per_token"], clock)
            diff = med(r["total_n"], clock) - med(r["total_1"], clock)
            out[name][clock] = {
                "decode_tokens_per_s": 1.0 / per_tok,
                "decode_ms_per_token_median": 1e3 * per_tok,
                "decode_ms_per_token_p90": 1e3 * statistics.quantiles(col(r["per_token"], clock), n=10)[-1],
                "decode_tokens_per_s_from_difference": (n - 1) / diff if diff > 0 else None,
                "end_to_end_tokens_per_s": n / med(r["total_n"], clock),
                "first_token_ms": 1e3 * med(r["first"], clock),
                "total_n_s": summary(col(r["total_n"], clock)),
                "total_1_s": summary(col(r["total_1"], clock)),
            }
    same = 0
    for a, b in zip(ids["speculant"], ids["hf_generate"]):
        if a != b:
            break
        same += 1
    out["greedy_identical_prefix"] = f"{same}/{n}"
    out["speedup"] = {c: out["speculant"][c]["decode_tokens_per_s"] / out["hf_generate"][c]["decode_tokens_per_s"]
                      for c in CLOCKS}
    out["load_avg_end"] = harness.load_avg()
    return out


# --- throughput -------------------------------------------------------------------
def tp_result(times: list[tuple[float, float]], useful: int) -> dict[str, Any]:
    return {c: {"seconds": summary(col(times, c)), "output_tokens_per_s": useful / med(times, c)}
            for c in CLOCKS}


def bench_throughput(cfg: dict, hf, tok, llm) -> dict[str, Any]:
    from speculant import SamplingParams

    pairs = bench_models.mixed_workload(cfg["num_requests"], cfg["prompt_range"], cfg["output_range"])
    prompts = bench_models.token_prompts(tok, [p for p, _ in pairs], seed=11)
    outs = [o for _, o in pairs]
    useful = sum(outs)
    reps = cfg["throughput_reps"]
    results: dict[str, Any] = {
        "num_requests": len(pairs), "prompt_tokens": sum(p for p, _ in pairs), "output_tokens": useful,
        "prompt_lens": [p for p, _ in pairs], "output_lens": outs, "reps": reps,
    }
    token_ids: dict[str, list[list[int]]] = {}

    # Speculant, engine defaults (max_num_batched_tokens 512, max_num_seqs 64)
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for o in outs]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    before = llm.get_metrics()
    times = []
    for rep in range(reps):
        t0 = stamp()
        res = llm.generate(prompts, params, use_tqdm=False)
        times.append(since(t0))
        token_ids["speculant"] = [list(r.outputs[0].token_ids) for r in res]
        log(f"throughput speculant rep {rep + 1}/{reps}: {times[-1][0]:.1f}s")
    assert [len(t) for t in token_ids["speculant"]] == outs, "speculant output lengths differ from max_tokens"
    results["speculant"] = tp_result(times, useful)
    results["speculant"]["settings"] = {"max_num_batched_tokens": llm.config.scheduler.max_num_batched_tokens,
                                        "max_num_seqs": llm.config.scheduler.max_num_seqs}
    after = llm.get_metrics()  # engine counters over the timed reps
    results["speculant"]["metrics_per_rep"] = {
        k: (v - before.get(k, 0)) / reps for k, v in after.items()
        if isinstance(v, (int, float)) and isinstance(before.get(k, 0), (int, float))}

    # HF continuous batching
    results["hf_continuous_batching"] = bench_hf_cb(hf, tok, prompts, outs, reps, llm, token_ids)

    # HF padded generate(): one left-padded batch, every row runs to the longest output
    tok.padding_side = "left"
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    times = []
    for rep in range(reps):
        t0 = stamp()
        with torch.inference_mode():
            out = hf.generate(**batch, do_sample=False, max_new_tokens=max(outs))
        times.append(since(t0))
        log(f"throughput hf padded rep {rep + 1}/{reps}: {times[-1][0]:.1f}s")
    width = batch["input_ids"].shape[1]
    token_ids["hf_padded"] = [out[i, width:width + o].tolist() for i, o in enumerate(outs)]
    results["hf_padded_generate"] = tp_result(times, useful)
    results["hf_padded_generate"].update(generated_incl_discarded=len(outs) * max(outs), padded_prompt_len=width)

    def tps(name: str, clock: str) -> float:
        return results[name].get(clock, {}).get("output_tokens_per_s") or 0.0

    hf_names = ("hf_continuous_batching", "hf_padded_generate")
    results["hf_best"] = {c: max(hf_names, key=lambda k: tps(k, c)) for c in CLOCKS}
    results["speedup_vs_hf_best"] = {
        c: tps("speculant", c) / tps(results["hf_best"][c], c) if tps(results["hf_best"][c], c) else None
        for c in CLOCKS}
    ref = "hf_continuous_batching" if "hf_continuous_batching" in token_ids else "hf_padded"
    results["greedy_identical_requests_vs_" + ref] = sum(
        a == b for a, b in zip(token_ids["speculant"], token_ids[ref]))
    results["load_avg_end"] = harness.load_avg()
    return results


def bench_hf_cb(hf, tok, prompts, outs, reps, llm, token_ids) -> dict[str, Any]:
    try:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError as exc:
        return {"unavailable": f"transformers has no continuous batching: {exc}"}
    if not hasattr(hf, "continuous_batching_context_manager"):
        return {"unavailable": "model has no continuous_batching_context_manager (generate_batch)"}
    import logging

    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)  # psutil warnings on CPU
    page = 256
    blocks = 4 + sum(-(-(len(p) + o) // page) for p, o in zip(prompts, outs))
    cb_cfg = ContinuousBatchingConfig(
        page_size=page, num_blocks=blocks,
        max_batch_tokens=llm.config.scheduler.max_num_batched_tokens,  # same token budget as Speculant
        max_requests_per_batch=len(prompts), allow_block_sharing=False,
    )
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max(outs), eos_token_id=-1,  # -1: EOS off
                               pad_token_id=tok.pad_token_id)

    def run(mgr, ps, os_):
        ids = [mgr.add_request(p, max_new_tokens=o) for p, o in zip(ps, os_)]
        done: dict[str, Any] = {}
        while len(done) < len(ids):
            r = mgr.get_result(timeout=5)
            if r is None:
                if not mgr.is_running():
                    raise RuntimeError("HF continuous batching thread stopped")
                continue
            if r.is_finished():
                if r.error is not None:
                    raise RuntimeError(f"HF continuous batching request failed: {r.error}")
                done[r.request_id] = r
        return [list(done[i].generated_tokens) for i in ids]

    times = []
    t_setup = time.perf_counter()
    try:
        with hf.continuous_batching_context_manager(generation_config=gen_cfg, continuous_batching_config=cb_cfg,
                                                     block=True, timeout=60) as mgr:
            setup = time.perf_counter() - t_setup
            run(mgr, prompts[:2], [4, 4])  # warm-up
            for rep in range(reps):
                t0 = stamp()
                got = run(mgr, prompts, outs)
                times.append(since(t0))
                log(f"throughput hf continuous batching rep {rep + 1}/{reps}: {times[-1][0]:.1f}s")
    except Exception as exc:  # noqa: BLE001 - report, don't lose the other results
        return {"unavailable": f"{type(exc).__name__}: {exc}"}
    assert [len(t) for t in got] == outs, "HF continuous batching output lengths differ from max_new_tokens"
    token_ids["hf_continuous_batching"] = got
    res = tp_result(times, sum(outs))
    res.update(setup_s=setup, attn_implementation=hf.config._attn_implementation,
               settings={"page_size": page, "num_blocks": blocks, "max_batch_tokens": cb_cfg.max_batch_tokens,
                         "max_requests_per_batch": len(prompts)})
    return res


# --- forward ----------------------------------------------------------------------
def bench_forward(cfg: dict, model_dir: Path, hf, backends: list[str]) -> dict[str, Any]:
    from transformers import DynamicCache

    from speculant.interfaces import QuerySpan

    prefix_len, ts, reps = cfg["prefix"], cfg["query_tokens"], cfg["forward_reps"]
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 20000, (prefix_len + max(ts),), generator=gen).tolist()
    calls: dict[str, dict[int, Any]] = {}
    keep_alive = []
    for lb in backends:
        llm = load_speculant(model_dir, linear_backend=lb, kv_cache_memory_gb=0.25)
        runner = llm.engine.view  # the target as plugins see it, on the engine's blocks
        seq, _ = runner.open_sequence("bench-forward")
        runner.grow(seq, prefix_len + max(ts))
        runner.forward([QuerySpan(seq, 0, ids[:prefix_len], [prefix_len - 1])])  # fill the prefix
        calls[f"speculant_{lb}"] = {
            t: (lambda t=t, r=runner, sq=seq: r.forward(
                [QuerySpan(sq, prefix_len, ids[prefix_len:prefix_len + t], list(range(t)))]))
            for t in ts}
        keep_alive.append(llm)
    cache = DynamicCache(config=hf.config)
    with torch.inference_mode():
        hf(input_ids=torch.tensor([ids[:prefix_len]]), cache=cache, use_cache=True)

    def hf_call(t: int) -> None:
        x = torch.tensor([ids[prefix_len:prefix_len + t]])
        pos = torch.arange(prefix_len, prefix_len + t).unsqueeze(0)
        with torch.inference_mode():
            hf(input_ids=x, position_ids=pos, cache=cache, use_cache=True)
        cache.crop(-t)  # negative: remove the last t tokens

    calls["hf_forward"] = {t: (lambda t=t: hf_call(t)) for t in ts}
    samples: dict[str, dict[int, list]] = {k: {t: [] for t in ts} for k in calls}
    for fns in calls.values():  # warm-up
        for fn in fns.values():
            fn()
    assert cache.get_seq_length() == prefix_len
    for _ in range(reps):  # interleave routes and sizes; time the second of two back-to-back calls
        for name, fns in calls.items():  # (steady state, as in consecutive decode steps)
            for t, fn in fns.items():
                fn()
                t0 = stamp()
                fn()
                samples[name][t].append(since(t0))
    out: dict[str, Any] = {"prefix_tokens": prefix_len, "reps": reps}
    for clock in CLOCKS:
        ms: dict[str, Any] = {}
        for name, per_t in samples.items():
            ms[name] = {t: 1e3 * med(v, clock) for t, v in per_t.items()}
            ms[name]["ratio_5_over_1"] = ms[name][5] / ms[name][1] if 5 in ts else None
            ms[name]["spread"] = {t: 1e3 * (max(col(v, clock)) - min(col(v, clock))) for t, v in per_t.items()}
        out[clock] = ms
    del keep_alive, calls
    gc.collect()
    out["load_avg_end"] = harness.load_avg()
    return out


# --- report -----------------------------------------------------------------------
def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def report(res: dict[str, Any]) -> str:
    env = res["environment"]
    lines = [f"### Speculant vs transformers on {env['cpu']} "
             f"({env['torch_threads']} torch thread(s) of {env['os_cpu_count']} cores, torch {env['torch']}, "
             f"transformers {env['transformers']})", ""]
    m = res["model"]
    sp = m["spec"]
    shape = (f"hidden {sp['hidden']}, {sp['layers']} layers, {sp['heads']} heads ({sp['kv_heads']} KV), "
             f"MLP {sp['intermediate']}, vocab {sp['vocab']}, "
             f"{'tied' if sp['tie_embeddings'] else 'untied'} embeddings")
    lines.append(f"Model: random Llama, {m['num_params_m']}M params ({shape}), float32; "
                 f"{m['weight_bytes_per_decode_step'] / 1e6:.0f} MB read per decode step; "
                 f"read bandwidth {res['bandwidth_gb_s']:.1f} GB/s ({res['bandwidth_source']}) -> bound "
                 f"{res['bound_ms_per_token']:.1f} ms/token ({1e3 / res['bound_ms_per_token']:.0f} tokens/s). "
                 f"Engine linear backend: {res['engine_linear_backend']}. "
                 f"Load average {env['load_avg']} at start, {env['load_avg_end']} at end. "
                 f"Command: `{res.get('command', '')}`; commit {env['git_commit']}.")
    lines += ["", "Each figure is given on two clocks: wall time, and process CPU time (steadier when other jobs "
                  "share the cores and torch runs one thread; see benchmarks/README.md).", ""]
    rows = []
    d = res.get("decode")
    if d:
        for name in ("speculant", "hf_generate"):
            w, c = d[name]["wall"], d[name]["cpu"]
            rows.append([f"batch-1 decode, {name}", f"{fmt(w['decode_tokens_per_s'])} tok/s",
                         f"{fmt(c['decode_tokens_per_s'])} tok/s",
                         f"{fmt(w['decode_ms_per_token_median'])} ms/token wall "
                         f"({fmt(100 * w['fraction_of_bandwidth_bound'], 0)}% of bound), "
                         f"{fmt(c['decode_ms_per_token_median'])} CPU "
                         f"({fmt(100 * c['fraction_of_bandwidth_bound'], 0)}%); "
                         f"end-to-end {fmt(w['end_to_end_tokens_per_s'])} tok/s; "
                         f"first token {fmt(w['first_token_ms'], 0)} ms"])
    tp = res.get("throughput")
    if tp:
        for name in ("speculant", "hf_continuous_batching", "hf_padded_generate"):
            r = tp[name]
            label = f"{tp['num_requests']} requests, {name}"
            if "unavailable" in r:
                rows.append([label, "n/a", "n/a", r["unavailable"][:120]])
                continue
            rows.append([label, f"{fmt(r['wall']['output_tokens_per_s'])} tok/s",
                         f"{fmt(r['cpu']['output_tokens_per_s'])} tok/s",
                         f"{fmt(r['wall']['seconds']['median'])} s wall for {tp['output_tokens']} output tokens "
                         f"({tp['prompt_tokens']} prompt tokens)"])
    if rows:
        lines.append(harness.markdown_table(["benchmark", "wall", "CPU time", "detail"], rows))
    if d or tp:
        same = [f"batch-1 greedy tokens identical to HF: {d['greedy_identical_prefix']}"] if d else []
        same += [f"{k.replace('_', ' ')}: {v}/{tp['num_requests']}" for k, v in (tp or {}).items()
                 if k.startswith("greedy_identical")]
        lines += ["", "Exactness check (fp32): " + "; ".join(same) + "."]
    f = res.get("forward")
    if f:
        routes = list(f["wall"])
        ts = [t for t in f["wall"][routes[0]] if isinstance(t, int)]
        lines += ["", f"Forward time, ms (median), T query tokens over a cached {f['prefix_tokens']}-token prefix, "
                      "logits at every query token:", ""]
        frows = [[name, clock] + [fmt(f[clock][name][t]) for t in ts] + [fmt(f[clock][name]["ratio_5_over_1"], 2)]
                 for name in routes for clock in CLOCKS]
        lines.append(harness.markdown_table(["route", "clock"] + [f"T={t}" for t in ts] + ["5/1"], frows))
    lines += ["", "Targets (issue 2):", ""]

    def verdict(p):
        return "PASS" if p else "FAIL" if p is False else "n/a"

    trows = [[t["name"], t["required"]] + [f"{fmt(t['value'][c], 2)}x {verdict(t['pass'][c])}" for c in CLOCKS]
             for t in res["targets"]]
    lines.append(harness.markdown_table(["target", "required", "wall", "CPU time"], trows))
    return "\n".join(lines) + "\n"


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    def entry(name: str, values: dict[str, float | None], op: str, bound: float) -> dict[str, Any]:
        ok = {c: None if v is None else (v >= bound if op == ">=" else v <= bound) for c, v in values.items()}
        return {"name": name, "required": f"{op} {bound}x", "value": values, "pass": ok}

    out = []
    d, f, tp = res.get("decode"), res.get("forward"), res.get("throughput")
    if d:
        out.append(entry("batch-1 decode tok/s, Speculant / HF generate()", d["speedup"], ">=",
                         TARGETS["decode_speedup"]))
    if f:
        route = f"speculant_{res['engine_linear_backend']}"
        vals = {c: f[c].get(route, {}).get("ratio_5_over_1") for c in CLOCKS}
        out.append(entry(f"5-token / 1-token forward ({route})", vals, "<=", TARGETS["forward_5_over_1"]))
    if tp:
        best = "/".join(sorted(set(tp["hf_best"].values())))
        out.append(entry(f"{tp['num_requests']}-request throughput, Speculant / HF best ({best})",
                         tp["speedup_vs_hf_best"], ">=", TARGETS["throughput_speedup"]))
    return out


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "engine.json", quick="tiny model and sizes, < 1 min",
                           cache_dir=bench_models.DEFAULT_CACHE_DIR)
    ap.add_argument("--only", default="decode,throughput,forward",
                    help="comma-separated sections: decode, throughput, forward")
    ap.add_argument("--md", type=Path, default=None, help="Markdown summary path (default: --out as .md)")
    ap.add_argument("--bandwidth-gbs", type=float, default=None,
                    help="use this read bandwidth (GB/s) for the bound instead of the measured one "
                         "(the measurement is unreliable while other jobs load the machine)")
    args = ap.parse_args()
    cfg = QUICK if args.quick else FULL
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = sections - {"decode", "throughput", "forward"}
    if unknown:
        ap.error(f"--only: unknown section(s) {sorted(unknown)}")
    bench = harness.start("engine", args)
    out_md = args.md or args.out.with_suffix(".md")
    model_dir = bench_models.ensure_model(cfg["model"], args.cache_dir)
    log(f"model {model_dir}")
    bw_start = read_bandwidth(cfg["bandwidth_bytes"])
    hf, tok = load_hf(model_dir)
    facts = bench_models.model_facts(model_dir)
    res: dict[str, Any] = {
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
        "model": {"dir": str(model_dir), "spec": bench_models.MODEL_SPECS[cfg["model"]].__dict__, **facts},
    }

    has_onednn = linear_backend_available()
    llm = load_speculant(model_dir)
    report_obj = getattr(llm.engine.runner, "linear_report", None)
    res["engine_linear_backend"] = getattr(report_obj, "backend", "default") if report_obj else "default"
    res["engine_linear_report"] = repr(report_obj)
    log(f"speculant loaded, linear backend: {res['engine_linear_backend']}")

    if "decode" in sections:
        res["decode"] = bench_decode(cfg, model_dir, hf, tok, llm)
    if "throughput" in sections:
        res["throughput"] = bench_throughput(cfg, hf, tok, llm)
    del llm
    gc.collect()
    if "forward" in sections:
        backends = ["default"] + (["onednn"] if has_onednn else [])
        res["forward"] = bench_forward(cfg, model_dir, hf, backends)
        if not has_onednn:
            res["forward"]["note"] = "speculant.model.linear.backend or oneDNN unavailable: onednn route skipped"
        res["engine_linear_backend"] = res["engine_linear_backend"] if has_onednn else "default"
    bw_end = read_bandwidth(cfg["bandwidth_bytes"])
    res["bandwidth_measurements"] = {"start": bw_start, "end": bw_end}
    if args.bandwidth_gbs:
        res["bandwidth_gb_s"], res["bandwidth_source"] = args.bandwidth_gbs, "given by --bandwidth-gbs"
    else:
        res["bandwidth_gb_s"] = max(bw_start["best_gb_s"], bw_end["best_gb_s"])
        res["bandwidth_source"] = "measured, best repeat"
    res["bound_ms_per_token"] = facts["weight_bytes_per_decode_step"] / res["bandwidth_gb_s"] / 1e6
    for name in ("speculant", "hf_generate") if "decode" in res else ():
        for clock in CLOCKS:
            d = res["decode"][name][clock]
            d["fraction_of_bandwidth_bound"] = res["bound_ms_per_token"] / d["decode_ms_per_token_median"]
    res["targets"] = targets(res)
    md = report(bench.write(res))
    out_md.write_text(md)
    print(md)
    log(f"wrote {out_md}")


def read_bandwidth(num_bytes: int) -> dict[str, float]:
    """Read bandwidth in GB/s with one thread and with every core (the bound is
    about the hardware, not the thread count the run picked)."""
    from speculant.bench.bandwidth import read_bandwidth as measure

    return measure(num_bytes, 7)


if __name__ == "__main__":
    main()
