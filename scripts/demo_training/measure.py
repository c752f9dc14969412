"""Throughput of one training step for candidate sizes (and of a teacher forward).

Used to pick the target size for the budget: tokens/s x minutes = tokens the
run will see. Reports wall-clock tokens/s (median and best timed step) and
tokens per CPU-second of this process; on a shared machine the wall-clock
numbers depend on the other load, the CPU-time ones (with --threads 1) much less.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from .objectives import Distillation, LanguageModeling
from .sizes import DRAFT_SIZES, TARGET_SIZES, llama_config
from .trainer import autocast, make_optimizer


def _model(size, vocab, seq_len):
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    m = LlamaForCausalLM(llama_config(size, vocab, 0, max(1024, seq_len)))
    return m


def time_steps(model, objective, batch, precision, warmup, steps, spec, train=True):
    opt, _ = make_optimizer(model, spec) if train else (None, None)
    times, cpu = [], []
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        if train:
            with autocast(precision):
                loss, _ = objective(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.no_grad(), autocast(precision):
                model(input_ids=batch[:, :-1], use_cache=False)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return times, cpu


def measure(names: list[str], precisions: list[str], micro_batch: int, seq_len: int, threads: int,
            steps: int, vocab: int = 4096, teacher: str | None = None) -> list[dict]:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, vocab, (micro_batch, seq_len + 1), generator=g)
    n_tok = micro_batch * seq_len
    spec = {"weight_decay": 0.1, "lr": 1e-3, "betas": (0.9, 0.95), "warmup": 1, "steps": 10, "min_lr_ratio": 0.1}
    results = []
    for name in names:
        kind = "draft" if name in DRAFT_SIZES and name not in TARGET_SIZES else "target"
        size = DRAFT_SIZES[name] if kind == "draft" else TARGET_SIZES[name]
        for precision in precisions:
            model = _model(size, vocab, seq_len).train()
            if kind == "draft" and teacher:
                t_model = _model(TARGET_SIZES[teacher], vocab, seq_len)
                objective = Distillation(t_model, 1.0, 0.0, 1.0)
            else:
                objective = LanguageModeling()
            times, cpu = time_steps(model, objective, batch, precision, 1, steps, spec)
            fwd, fwd_cpu = time_steps(model.eval(), None, batch, precision, 1, max(2, steps // 2), spec, train=False)
            row = {"size": name, "kind": kind, "params_M": round(size.params(vocab) / 1e6, 2),
                   "precision": precision, "threads": threads, "micro_batch": micro_batch, "seq_len": seq_len,
                   "train_tok_s_median": round(n_tok / statistics.median(times)),
                   "train_tok_s_best": round(n_tok / min(times)),
                   "forward_tok_s_best": round(n_tok / min(fwd)),
                   # tokens per CPU-second of this process: insensitive to other processes on the
                   # machine; with 1 thread it estimates the unloaded single-core speed
                   "train_tok_per_cpu_s": round(n_tok / statistics.median(cpu)),
                   "forward_tok_per_cpu_s": round(n_tok / statistics.median(fwd_cpu)),
                   "teacher": teacher if kind == "draft" else None,
                   "loadavg_1min": round(os.getloadavg()[0], 2)}
            results.append(row)
            print(row, file=sys.stderr, flush=True)
    return results
