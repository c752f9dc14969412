"""Command line: the stages and how they chain.

    tokenizer  corpus manifest + split, BPE tokenizer, token arrays     -> WORK/{corpus,tokenizer,data}
    target     train the target (resumable)                             -> WORK/target/{ckpt.pt,log.jsonl,final,best}
    draft      distil the draft from the target (resumable)             -> WORK/draft/...
    export     16-bit HF dirs + load-back check                         -> MODELS/demo-{target,draft}, WORK/export.json
    eval       held-out loss, greedy alpha, degeneracy                  -> WORK/eval.json
    all        the five in order; finished stages are skipped, paused ones resumed (with --resume)
    measure    training throughput of candidate sizes                   -> WORK/measure.json

Exit status 75 means "paused by the --minutes budget or a signal": run the same command with --resume.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from . import corpus, data, evaluate, export, measure, objectives, sizes, tokenizer, trainer

ROOT = Path(__file__).resolve().parents[2]
EXIT_PAUSED = 75


class Paths:
    def __init__(self, work: Path, models: Path):
        self.work, self.models = work, models
        self.manifest = work / "corpus" / "manifest.json"
        self.tokenizer = work / "tokenizer"
        self.data = work / "data"
        self.target, self.draft = work / "target", work / "draft"
        self.target_out, self.draft_out = models / "demo-target", models / "demo-draft"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="train_demo_models.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["tokenizer", "target", "draft", "export", "eval", "all", "measure"])
    g = p.add_argument_group("common")
    g.add_argument("--work-dir", default=str(ROOT / ".train"), help="checkpoints, logs, data (default: .train/)")
    g.add_argument("--models-dir", default=str(ROOT / "models"),
                   help="where export writes demo-target/ and demo-draft/")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--data-seed", type=int, default=None,
                   help="seed of the training-window order (default: --seed); the corpus split always uses --seed")
    g.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a CPU shared with other work, 2 threads measured slower "
                        "than 1; on an idle machine try all cores, see `measure`)")
    g.add_argument("--minutes", type=float, default=None,
                   help="wall-clock budget for this invocation; training pauses with a checkpoint when it is spent")
    g.add_argument("--resume", action="store_true", help="continue existing checkpoints")
    g.add_argument("--fresh", action="store_true",
                   help="delete the selected stages' previous outputs first (never keep it in a command "
                        "you rerun to resume)")
    g = p.add_argument_group("corpus and tokenizer")
    g.add_argument("--vocab", type=int, default=4096)
    g.add_argument("--heldout-fraction", type=float, default=0.05)
    g = p.add_argument_group("training (both models)")
    g.add_argument("--size", default="t12m", choices=sorted(sizes.TARGET_SIZES))
    g.add_argument("--draft-size", default="d1m", choices=sorted(sizes.DRAFT_SIZES))
    g.add_argument("--steps", type=int, default=None,
                   help="target schedule length (default: planned, see --plan-minutes)")
    g.add_argument("--draft-steps", type=int, default=None)
    g.add_argument("--plan-minutes", type=float, default=90.0,
                   help="when --steps is not given: size the target schedule to this much wall time, "
                        "from the step time measured during warmup")
    g.add_argument("--draft-plan-minutes", type=float, default=30.0)
    g.add_argument("--lr", type=float, default=None, help="target peak LR (default: the size's)")
    g.add_argument("--draft-lr", type=float, default=None)
    g.add_argument("--init-from", default=None,
                   help="continue training the target from this HF model dir (same size and tokenizer) "
                        "with a new schedule, instead of from random weights")
    g.add_argument("--draft-init-from", default=None, help="the same for the draft")
    g.add_argument("--warmup", type=int, default=100)
    g.add_argument("--micro-batch", type=int, default=8)
    g.add_argument("--accum", type=int, default=2)
    g.add_argument("--seq-len", type=int, default=512)
    g.add_argument("--max-positions", type=int, default=1024)
    g.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                   help="bf16 autocast (fp32 master weights) or plain fp32")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--eval-every", type=int, default=100)
    g.add_argument("--eval-tokens", type=int, default=32768, help="held-out tokens in the periodic eval")
    g.add_argument("--ckpt-minutes", type=float, default=10.0)
    g.add_argument("--ckpt-every-steps", type=int, default=None)
    g.add_argument("--stop-at-step", type=int, default=None, help="pause at this step (for testing resume)")
    g = p.add_argument_group("draft distillation")
    g.add_argument("--kd-weight", type=float, default=1.0)
    g.add_argument("--ce-weight", type=float, default=0.0)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--teacher", choices=["final", "best"], default="final", help="which target weights to distil")
    g.add_argument("--teacher-dir", default=None,
                   help="distil from this HF model dir instead of WORK/target/{final,best} (export then needs "
                        "the target trained in WORK to be that model: use it for a warm-up draft run)")
    g = p.add_argument_group("export and eval")
    g.add_argument("--disk-dtype", choices=sorted(export.DISK_DTYPES), default="float16")
    g.add_argument("--target-dir", default=None, help="eval: target model dir (default: the export)")
    g.add_argument("--draft-dir", default=None, help="eval: draft model dir (default: the export)")
    g.add_argument("--prompts", type=int, default=32)
    g.add_argument("--prompt-len", type=int, default=64)
    g.add_argument("--gen-len", type=int, default=256)
    g.add_argument("--loss-tokens", type=int, default=None, help="eval: cap on held-out tokens for the loss")
    g.add_argument("--out", default=None, help="eval/measure: JSON output path")
    g = p.add_argument_group("measure")
    g.add_argument("--candidates", default="t6m,t12m,t20m,t30m")
    g.add_argument("--precisions", default="fp32,bf16")
    g.add_argument("--measure-steps", type=int, default=3)
    g.add_argument("--teacher-size", default=None, help="measure: time draft steps with this target as teacher")
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- stages

def stage_tokenizer(a, paths: Paths) -> str:
    if a.fresh:
        for d in (paths.manifest.parent, paths.tokenizer, paths.data):
            shutil.rmtree(d, ignore_errors=True)
    if (paths.data / "meta.json").exists():
        meta = json.loads((paths.data / "meta.json").read_text())
        current = corpus.select_files(corpus.stdlib_root(), a.seed, a.heldout_fraction)[0]
        digest = hashlib.sha256("".join(f"{f.path}:{f.sha256}:{f.split}\n" for f in current).encode()).hexdigest()
        if digest != meta["manifest_digest"]:
            raise SystemExit(f"{paths.data} was built from a different corpus (another Python version, seed or "
                             "split?); pass --fresh to rebuild it (and retrain)")
        log(f"tokenizer and data already built ({meta['n_tokens']})")
        return "done"
    manifest = corpus.build_manifest(paths.manifest, a.seed, a.heldout_fraction)
    log(f"corpus: Python {manifest['python']} stdlib, files {manifest['n_files']}, bytes {manifest['n_bytes']}, "
        f"skipped {manifest['skipped']}")
    tokenizer.train_tokenizer(manifest, paths.tokenizer, a.vocab, a.max_positions)
    meta = tokenizer.build_token_arrays(manifest, paths.tokenizer, paths.data, a.seed)
    log(f"tokens {meta['n_tokens']}, {meta['bytes_per_token_train']:.2f} bytes/token")
    return "done"


def _common_spec(a, kind: str, size_name: str, size: sizes.Size, steps, plan, lr, meta) -> dict:
    return {"kind": kind, "size": size_name, "steps": steps, "plan_minutes": None if steps else plan,
            "warmup": a.warmup, "lr": lr or size.lr, "min_lr_ratio": 0.1, "weight_decay": a.weight_decay,
            "betas": [0.9, 0.95], "grad_clip": 1.0, "micro_batch": a.micro_batch, "accum": a.accum,
            "seq_len": a.seq_len, "precision": a.precision, "seed": a.seed, "threads": a.threads,
            "eval_every": a.eval_every, "eval_tokens": a.eval_tokens, "params": size.params(meta["vocab_size"]),
            "data_digest": meta["manifest_digest"] + ":" + meta["tokenizer_digest"],
            "data_seed": a.seed if a.data_seed is None else a.data_seed, "init_digest": None}


def _new_model(size: sizes.Size, meta: dict, a, seed: int):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(sizes.llama_config(size, meta["vocab_size"], meta["eos_token_id"], a.max_positions))


def _init_model(src: str, size: sizes.Size, meta: dict, paths: Paths, spec: dict):
    """Weights of an earlier run to continue from; refuses another architecture or tokenizer."""
    from transformers import AutoModelForCausalLM
    src_dir = Path(src)
    if not (src_dir / "model.safetensors").exists():
        raise SystemExit(f"--init-from {src}: no model.safetensors there (pass an HF model directory)")
    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32)
    c = model.config
    got = (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
           c.intermediate_size, c.vocab_size)
    want = (size.hidden, size.layers, size.heads, size.kv_heads, size.intermediate, meta["vocab_size"])
    if got != want:
        raise SystemExit(f"--init-from {src}: shape (hidden, layers, heads, kv_heads, intermediate, vocab) "
                         f"{got} differs from the selected size {spec['size']} {want}; pick the matching size")
    if tokenizer.load_tokenizer(src_dir).get_vocab() != tokenizer.load_tokenizer(paths.tokenizer).get_vocab():
        raise SystemExit(f"--init-from {src}: its tokenizer differs from {paths.tokenizer}; rebuild the "
                         "tokenizer stage with the settings that model was trained with")
    spec["init_digest"] = sha256_file(src_dir / "model.safetensors")
    log(f"continuing from {src_dir} (sha256 {spec['init_digest'][:12]})")
    return model


def _already_trained(a, run_dir: Path) -> bool:
    if a.fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
        return False
    if (run_dir / "DONE.json").exists():
        log(f"{run_dir.name}: already trained ({json.loads((run_dir / 'DONE.json').read_text())['summary']})")
        return True
    return False


def _run_training(a, paths: Paths, run_dir: Path, spec: dict, model, objective, deadline) -> str:
    train_tokens, heldout, meta = tokenizer.load_arrays(paths.data)
    windows = data.PackedWindows(train_tokens, spec["seq_len"], spec["data_seed"] + (spec["kind"] == "draft"))
    eval_set = data.eval_windows(heldout, spec["seq_len"], spec["eval_tokens"])
    log(f"{run_dir.name}: {spec['size']} ({spec['params'] / 1e6:.2f}M params), "
        f"{spec['micro_batch'] * spec['accum'] * spec['seq_len']} tokens/step, precision {spec['precision']}")
    status = trainer.train(run_dir, spec, model, objective, windows, eval_set, resume=a.resume, deadline=deadline,
                           ckpt_minutes=a.ckpt_minutes, ckpt_every_steps=a.ckpt_every_steps,
                           stop_at_step=a.stop_at_step)
    if status != "done":
        return status
    model.save_pretrained(run_dir / "final")
    tok = tokenizer.load_tokenizer(paths.tokenizer)
    for d in ("final", "best"):
        if (run_dir / d).exists():
            tok.save_pretrained(run_dir / d)
    records = [json.loads(x) for x in (run_dir / "log.jsonl").read_text().splitlines() if x.strip()]
    evals = [r for r in records if "eval_loss" in r]
    steps = [r for r in records if "loss" in r]
    summary = {"steps": steps[-1]["step"], "tokens": steps[-1]["tokens"], "epochs": steps[-1]["epoch"],
               "train_minutes": round(steps[-1]["train_seconds"] / 60, 1), "final_loss": steps[-1]["loss"],
               "final_eval_loss": evals[-1]["eval_loss"] if evals else None,
               "best_eval_loss": min((r["eval_loss"] for r in evals), default=None)}
    if "eval_agree" in (evals[-1] if evals else {}):
        summary["final_eval_agree"] = evals[-1]["eval_agree"]
    (run_dir / "DONE.json").write_text(json.dumps({"summary": summary, "spec": spec}, indent=1))
    log(f"{run_dir.name}: done {summary}")
    return "done"


def stage_target(a, paths: Paths, deadline) -> str:
    if _already_trained(a, paths.target):
        return "done"
    _, _, meta = tokenizer.load_arrays(paths.data)
    size = sizes.TARGET_SIZES[a.size]
    spec = _common_spec(a, "target", a.size, size, a.steps, a.plan_minutes, a.lr, meta)
    model = _init_model(a.init_from, size, meta, paths, spec) if a.init_from else _new_model(size, meta, a, a.seed)
    return _run_training(a, paths, paths.target, spec, model, objectives.LanguageModeling(), deadline)


def load_teacher(paths: Paths, which: str, disk_dtype: str, teacher_dir: str | None = None):
    from transformers import AutoModelForCausalLM
    src = Path(teacher_dir) if teacher_dir else paths.target / which
    if teacher_dir and not (src / "model.safetensors").exists():
        raise SystemExit(f"--teacher-dir {teacher_dir}: no model.safetensors there (pass an HF model directory)")
    if not teacher_dir and (not (paths.target / "DONE.json").exists() or not src.exists()):
        raise SystemExit(f"the draft needs a trained target: {src} is missing (run the target stage first)")
    teacher = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    # distil exactly what ships: the weights as they will be after the 16-bit export
    return export.round_trip_(teacher, disk_dtype).eval(), sha256_file(src / "model.safetensors")


def stage_draft(a, paths: Paths, deadline) -> str:
    if _already_trained(a, paths.draft):
        return "done"
    _, _, meta = tokenizer.load_arrays(paths.data)
    size = sizes.DRAFT_SIZES[a.draft_size]
    teacher, digest = load_teacher(paths, a.teacher, a.disk_dtype, a.teacher_dir)
    spec = _common_spec(a, "draft", a.draft_size, size, a.draft_steps, a.draft_plan_minutes, a.draft_lr, meta)
    spec.update(kd_weight=a.kd_weight, ce_weight=a.ce_weight, temperature=a.temperature,
                teacher_digest=digest, teacher=a.teacher, disk_dtype=a.disk_dtype)
    model = (_init_model(a.draft_init_from, size, meta, paths, spec) if a.draft_init_from
             else _new_model(size, meta, a, a.seed + 1))
    objective = objectives.Distillation(teacher, a.kd_weight, a.ce_weight, a.temperature)
    return _run_training(a, paths, paths.draft, spec, model, objective, deadline)


def stage_export(a, paths: Paths) -> str:
    _, heldout, _ = tokenizer.load_arrays(paths.data)
    report = {"disk_dtype": a.disk_dtype}
    for run_dir in (paths.target, paths.draft):
        if not (run_dir / "DONE.json").exists():
            raise SystemExit(f"{run_dir.name} is not trained yet ({run_dir}/DONE.json missing)")
    # ship the target weights the draft was distilled from (final unless the draft used --teacher best)
    draft_spec = json.loads((paths.draft / "DONE.json").read_text())["spec"]
    if draft_spec.get("disk_dtype", a.disk_dtype) != a.disk_dtype:
        raise SystemExit(f"the draft was distilled from the target rounded to {draft_spec['disk_dtype']}; "
                         f"export with --disk-dtype {draft_spec['disk_dtype']}")
    sources = {"target": paths.target / draft_spec.get("teacher", "final"), "draft": paths.draft / "final"}
    for name, out in (("target", paths.target_out), ("draft", paths.draft_out)):
        export.export_model(sources[name], out, paths.tokenizer, a.disk_dtype)
        report[name] = export.verify(sources[name], out, heldout, a.seq_len)
        report[name]["dir"], report[name]["source"] = str(out), str(sources[name])
        log(f"exported {name} -> {out}: {report[name]['bytes'] / 1e6:.1f} MB, max |logit diff| "
            f"{report[name]['max_abs_logit_diff']:.2e}, argmax agreement {report[name]['argmax_agreement']:.4f}")
    report["bundle_mb"] = (report["target"]["bytes"] + report["draft"]["bytes"]) / 1e6
    if report["bundle_mb"] > 80:
        log(f"warning: bundle is {report['bundle_mb']:.1f} MB, over the ~80 MB goal")
    export.write_report(paths.work / "export.json", report)
    return "done"


def stage_eval(a, paths: Paths) -> dict:
    from transformers import AutoModelForCausalLM
    _, heldout, meta = tokenizer.load_arrays(paths.data)
    t_dir = Path(a.target_dir) if a.target_dir else paths.target_out
    d_dir = Path(a.draft_dir) if a.draft_dir else paths.draft_out

    def load(d):
        return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()

    t0 = time.time()
    with torch.no_grad():
        result = evaluate.evaluate_pair(load(t_dir), load(d_dir), tokenizer.load_tokenizer(t_dir), heldout,
                                        meta["heldout_docs"], n_prompts=a.prompts, prompt_len=a.prompt_len,
                                        gen_len=a.gen_len, seq_len=a.seq_len, seed=a.seed, loss_tokens=a.loss_tokens)
    result.update(target_dir=str(t_dir), draft_dir=str(d_dir), seconds=round(time.time() - t0, 1))
    out = Path(a.out) if a.out else paths.work / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    log(f"eval -> {out}: loss {result['heldout_loss']}, alpha {result['alpha_greedy']:.3f}, "
        f"tokens/step(k=4) {result['tokens_per_verify_step']['k=4']:.2f}, non-degenerate {result['non_degenerate']} "
        f"(target {result['target_text']}, reference {result['reference_text']})")
    return result


def stage_measure(a, paths: Paths) -> None:
    rows = measure.measure(a.candidates.split(","), a.precisions.split(","), a.micro_batch, a.seq_len,
                           a.threads, a.measure_steps, a.vocab, a.teacher_size)
    out = Path(a.out) if a.out else paths.work / "measure.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    log(f"measurements -> {out}")


def main(argv=None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    paths = Paths(Path(a.work_dir), Path(a.models_dir))
    deadline = time.time() + a.minutes * 60 if a.minutes else None
    if a.stage == "measure":
        stage_measure(a, paths)
        return 0
    if a.stage != "tokenizer" and a.stage != "all" and not (paths.data / "meta.json").exists():
        raise SystemExit(f"no data in {paths.data}: run the tokenizer stage first")
    stages = ["tokenizer", "target", "draft", "export", "eval"] if a.stage == "all" else [a.stage]
    for stage in stages:
        if stage == "tokenizer":
            status = stage_tokenizer(a, paths)
        elif stage == "target":
            status = stage_target(a, paths, deadline)
        elif stage == "draft":
            status = stage_draft(a, paths, deadline)
        elif stage == "export":
            status = stage_export(a, paths)
        else:
            stage_eval(a, paths)
            status = "done"
        if status != "done":
            log(f"{stage} paused; run the same command again with --resume to continue")
            return EXIT_PAUSED
    return 0
