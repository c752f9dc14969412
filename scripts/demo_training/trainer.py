"""The training loop shared by target and draft.

AdamW, linear warmup then cosine decay to ``min_lr_ratio`` of the peak,
gradient accumulation, optional bf16 autocast (fp32 master weights), periodic
held-out evaluation, checkpoints every N minutes and on SIGINT/SIGTERM, a
wall-clock budget, and one JSONL record per optimizer step. Resuming restores
model, optimizer, scheduler, RNG and data position, so the loss trajectory of
an interrupted run equals that of an uninterrupted one (same thread count).
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from . import checkpoint
from .data import PackedWindows

# Settings that define the trajectory: a resumed run must not change them.
TRAJECTORY_KEYS = ("kind", "size", "steps", "warmup", "lr", "min_lr_ratio", "weight_decay", "betas",
                   "grad_clip", "micro_batch", "accum", "seq_len", "precision", "seed", "plan_minutes",
                   "kd_weight", "ce_weight", "temperature", "teacher_digest", "data_digest", "data_seed",
                   "init_digest")


class Objective(Protocol):
    def __call__(self, model: torch.nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]: ...


def autocast(precision: str):
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lr_lambda(spec: dict) -> Callable[[int], float]:
    """Warmup then cosine; reads spec["steps"] lazily because a planned run fixes it only at the end
    of warmup (the warmup part does not depend on it)."""
    warmup, min_ratio = spec["warmup"], spec["min_lr_ratio"]

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        total = spec["steps"]
        assert total is not None, "schedule length must be fixed by the end of warmup"
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def make_optimizer(model: torch.nn.Module, spec: dict):
    decay, no_decay = [], []
    seen = set()
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec["lr"], betas=tuple(spec["betas"]), eps=1e-8, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(spec))
    return opt, sched


@torch.no_grad()
def evaluate(model, objective: Objective, windows: torch.Tensor, batch_size: int, precision: str) -> dict[str, float]:
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    n = 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i:i + batch_size]
        with autocast(precision):
            _, metrics = objective(model, batch)
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + v * len(batch)
        n += len(batch)
    model.train(was_training)
    return {f"eval_{k}": v / n for k, v in sums.items()}


class JsonlLog:
    def __init__(self, path: Path):
        self.path = path

    def truncate_after(self, step: int) -> None:
        """Drop records of steps the resumed run will redo (progress lost after the last checkpoint)."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


class _StopFlag:
    def __init__(self):
        self.reason: str | None = None

    def __enter__(self):
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, _frame):
        if self.reason is not None:          # second signal: give up at once
            raise KeyboardInterrupt
        self.reason = signal.Signals(signum).name
        print(f"[train] {self.reason}: saving a checkpoint after this step", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def check_same_trajectory(saved: dict, spec: dict) -> None:
    """Refuse a resume that would change the trajectory; adopt a planned run's fixed length."""
    keys = [k for k in TRAJECTORY_KEYS if not (k == "steps" and spec.get("steps") is None)]
    diffs = [f"{k}: checkpoint {saved.get(k)!r} vs now {spec.get(k)!r}" for k in keys if saved.get(k) != spec.get(k)]
    if diffs:
        raise SystemExit("refusing to resume with different settings (the trajectory would change):\n  "
                         + "\n  ".join(diffs) + "\nresume without those flags, or start over with --fresh")
    spec["steps"] = saved["steps"]
    if saved.get("threads") != spec.get("threads"):
        print(f"[train] warning: checkpoint used {saved.get('threads')} threads, now {spec.get('threads')}: "
              "the run continues correctly but is no longer bit-identical to an uninterrupted one",
              file=sys.stderr, flush=True)


def plan_steps(spec: dict, step_seconds: list[float], eval_seconds: float) -> int:
    """Schedule length that fills spec["plan_minutes"] of wall time at the speed seen during warmup
    (median step time, plus the periodic evaluations)."""
    per_step = sorted(step_seconds)[len(step_seconds) // 2] + eval_seconds / spec["eval_every"]
    return max(spec["warmup"] + 1, int(spec["plan_minutes"] * 60 / per_step))


def train(run_dir: Path, spec: dict, model: torch.nn.Module, objective: Objective, data: PackedWindows,
          eval_set: torch.Tensor, *, resume: bool, deadline: float | None, ckpt_minutes: float,
          ckpt_every_steps: int | None = None, stop_at_step: int | None = None,
          progress_every: int = 10) -> str:
    """Train until spec['steps'] ("done") or until the deadline / a signal / stop_at_step ("paused")."""
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = run_dir / "ckpt.pt"
    log = JsonlLog(run_dir / "log.jsonl")
    opt, sched = make_optimizer(model, spec)
    step, tokens_seen, train_seconds = 0, 0, 0.0
    step_seconds: list[float] = []          # warmup step times, for a planned (--plan-minutes) run
    best_eval = math.inf                     # the lowest eval loss so far; its weights are in best/
    if resume and ckpt_path.exists():
        state = checkpoint.load(ckpt_path)
        check_same_trajectory(state["spec"], spec)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        data.load_state_dict(state["data"])
        checkpoint.set_rng_state(state["rng"])
        step, tokens_seen, train_seconds = state["step"], state["tokens_seen"], state["train_seconds"]
        step_seconds, best_eval = state.get("step_seconds", []), state.get("best_eval", math.inf)
        log.truncate_after(step)
        log.write({"event": "resume", "step": step, "time": time.time()})
        print(f"[train] resumed {run_dir} at step {step}/{spec['steps'] or '?'}", file=sys.stderr, flush=True)
    elif ckpt_path.exists():
        raise SystemExit(f"{ckpt_path} exists: pass --resume to continue it or --fresh to start over")
    else:
        log.path.write_text("")
        log.write({"event": "start", "step": 0, "spec": spec, "time": time.time()})

    def save(reason: str) -> None:
        checkpoint.save(ckpt_path, {
            "spec": spec, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "data": data.state_dict(), "rng": checkpoint.rng_state(),
            "step": step, "tokens_seen": tokens_seen, "train_seconds": train_seconds, "step_seconds": step_seconds,
            "best_eval": best_eval,
            "model_config": model.config.to_dict(),
        })
        log.write({"event": "checkpoint", "step": step, "reason": reason, "time": time.time()})

    tokens_per_step = spec["micro_batch"] * spec["accum"] * spec["seq_len"]
    last_ckpt = time.monotonic()
    model.train()
    with _StopFlag() as stop:
        while spec["steps"] is None or step < spec["steps"]:
            if stop.reason or (deadline is not None and time.time() >= deadline) or \
                    (stop_at_step is not None and step >= stop_at_step):
                save(stop.reason or ("budget" if stop_at_step is None or step < stop_at_step else "stop_at_step"))
                print(f"[train] paused at step {step}/{spec['steps'] or '?'}; continue with --resume",
                      file=sys.stderr, flush=True)
                return "paused"
            t0 = time.perf_counter()
            lr = opt.param_groups[0]["lr"]
            totals: dict[str, float] = {}
            for _ in range(spec["accum"]):
                batch = data.next_batch(spec["micro_batch"])
                with autocast(spec["precision"]):
                    loss, metrics = objective(model, batch)
                (loss / spec["accum"]).backward()
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v / spec["accum"]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), spec["grad_clip"]))
            opt.step()
            opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            step += 1
            tokens_seen += tokens_per_step
            train_seconds += dt
            record = {"step": step, **totals, "lr": lr, "grad_norm": grad_norm,
                      "tok_per_s": tokens_per_step / dt, "tokens": tokens_seen,
                      "epoch": round(data.epochs_done, 4), "train_seconds": round(train_seconds, 2)}
            if spec["steps"] is None:
                step_seconds.append(dt)
                if step >= spec["warmup"]:      # end of warmup: fix the schedule length from the speed seen
                    t_eval = time.perf_counter()
                    record.update(evaluate(model, objective, eval_set, spec["micro_batch"], spec["precision"]))
                    spec["steps"] = plan_steps(spec, step_seconds[2:] or step_seconds, time.perf_counter() - t_eval)
                    record["planned_steps"] = spec["steps"]
                    print(f"[train] planned {spec['steps']} steps for {spec['plan_minutes']} min "
                          f"(reproduce exactly with --steps {spec['steps']})", file=sys.stderr, flush=True)
            sched.step()                        # the LR after warmup needs spec["steps"]
            if spec["steps"] is not None and (step % spec["eval_every"] == 0 or step == spec["steps"]) \
                    and "eval_loss" not in record:
                record.update(evaluate(model, objective, eval_set, spec["micro_batch"], spec["precision"]))
            if record.get("eval_loss", math.inf) < best_eval:
                best_eval = record["eval_loss"]
                model.save_pretrained(run_dir / "best")
                record["best"] = True
            log.write(record)
            if step % progress_every == 0 or "eval_loss" in record:
                total = spec["steps"]
                eta = f"eta {(total - step) * train_seconds / step / 60:.1f} min" if total else "planning"
                shown = {k: round(v, 4) for k, v in record.items() if k in ("loss", "eval_loss", "agree", "eval_agree")}
                print(f"[train] step {step}/{total or '?'} {shown} {tokens_per_step / dt:.0f} tok/s "
                      f"epoch {data.epochs_done:.2f} {eta}", file=sys.stderr, flush=True)
            if (time.monotonic() - last_ckpt) >= ckpt_minutes * 60 or \
                    (ckpt_every_steps and step % ckpt_every_steps == 0):
                save("periodic")
                last_ckpt = time.monotonic()
        save("done")
    return "done"
