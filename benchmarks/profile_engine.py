"""Where does Speculant's generation time go? A sampling profile, by stage.

Runs one workload on the benchmark model (``benchmarks/bench_models.py``) under
``py-spy`` (wall-clock sampling, idle included, so time spent waiting for a busy
core counts where it is spent) and folds the samples into engine stages:

* ``linear``       linear layers (oneDNN packed or ``nn.Linear``), LM head included
* ``attention``    the attention seam: K/V cache writes, gathers, masks, SDPA
* ``metadata``     per-forward span tensors and attention metadata
* ``model other``  the rest of the HF forward: embeddings, norms, rotary, MLP
                   activation, residual adds, HF's Python
* ``runner other`` ``ModelRunner.forward`` outside the model call (logits gather,
                   hidden-state capture)
* ``layout``       laying a step out as spans and splitting the logits back
* ``sampling``     sampling / acceptance (``step.decide``)
* ``commit``       appending tokens and stop rules (``step.commit``)
* ``outputs``      building ``RequestOutput``s, detokenization
* ``schedule``     the scheduler
* ``loop other``   everything else under ``LLM.generate``

With ``--target DIR`` (and ``--draft DIR``) any local model (pair) replaces the
benchmark model; ``spec-decode`` is the ``decode`` workload with draft-model
speculation (k = ``--k``) and ``hf-assisted`` is transformers' assisted generation
on the same pair; the ``draft model`` stage collects everything the draft does.

Workloads: ``decode`` (batch 1, 128 new tokens after a 64-token prompt),
``throughput`` (the 32 mixed requests of ``bench_engine.py``) and ``hf-decode``
(transformers ``generate()`` on the same decode, split into linear / attention /
other for comparison).

Usage::

    python benchmarks/profile_engine.py --workload decode
    python benchmarks/profile_engine.py --workload throughput --threads 1
    python benchmarks/profile_engine.py --workload decode --quick
    python benchmarks/profile_engine.py --workload spec-decode --target models/demo-target \
        --draft models/demo-draft --threads 1 --out /tmp/profile_demo_spec.json
    python benchmarks/profile_engine.py --workload throughput --out /tmp/profile_throughput.json

Needs ``py-spy`` on PATH (``pip install py-spy``); ``--cprofile`` uses the
standard library profiler instead (deterministic, but it inflates Python-heavy
stages).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_models
import harness

# (stage, frame markers): a sample goes to the first stage one of whose markers
# appears in any frame of its stack; order matters (innermost ideas first).
STAGES = [
    ("draft model", ["(speculant/proposers/draft_model.py", "(transformers/generation/candidate_generator.py"]),
    ("linear", ["OneDNNLinear.forward", "Linear.forward (torch/nn/modules/linear.py",
                "forward (torch/nn/modules/linear.py", "forward (speculant/model/linear/backend.py"]),
    ("attention", ["speculant_attention (", "sdpa_attention_forward (", "paged_attention_forward",
                   "eager_attention_forward"]),
    ("metadata", ["build (speculant/model/attention/span_tensors.py", "build_metadata (",
                  "slot_mapping (speculant/model/runner.py"]),
    ("model other", ["forward (transformers/models/"]),
    ("runner other", ["forward (speculant/model/runner.py"]),
    ("layout", ["(speculant/interfaces/layout.py", "(speculant/scorers/"]),
    ("sampling", ["decide (speculant/engine/step.py", "(speculant/sampling/sampler.py",
                  "(speculant/sampling/logits_processing.py", "(speculant/sampling/acceptance.py"]),
    ("commit", ["(speculant/engine/commit.py", "(speculant/engine/stop_rules.py"]),
    ("outputs", ["_output (speculant/engine/llm_engine.py", "_detokenize (speculant/engine/llm_engine.py"]),
    ("schedule", ["(speculant/engine/scheduler.py"]),
    ("hf generate other", ["generate (transformers/generation/utils.py"]),
    ("loop other", ["generate (speculant/llm.py"]),
]
ROOT_MARKERS = {"speculant": "generate (speculant/llm.py", "hf": "generate (transformers/generation/utils.py"}


def normalise(frame: str) -> str:
    """'func (/abs/path/site-packages/pkg/mod.py:12)' -> 'func (pkg/mod.py:12)'."""
    for anchor in ("site-packages/", str(harness.REPO_ROOT) + "/"):
        if anchor in frame:
            head, _, tail = frame.partition("(")
            return head + "(" + tail[tail.find(anchor) + len(anchor):] if anchor in tail else frame
    return frame


def fold(raw_path: Path, root: str) -> tuple[collections.Counter, int, collections.Counter]:
    stages: collections.Counter = collections.Counter()
    leaves: collections.Counter = collections.Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [normalise(f) for f in stack.split(";")]
        if not any(root in f for f in frames):
            continue  # model loading, warm-up setup, imports
        n = int(count)
        total += n
        stage = next((name for name, marks in STAGES if any(m in f for f in frames for m in marks)), "unattributed")
        stages[stage] += n
        leaves[frames[-1]] += n
    return stages, total, leaves


def run_workload(args) -> None:
    import torch

    harness.pin_threads(args.threads)
    cfg = dict(model="quick", prompt=16, tokens=16, requests=8, prange=(8, 48), orange=(4, 16)) if args.quick \
        else dict(model="bench", prompt=64, tokens=128, requests=32, prange=(16, 256), orange=(16, 128))
    model_dir = args.target or bench_models.ensure_model(cfg["model"], args.cache_dir)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if args.workload in ("hf-decode", "hf-assisted"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).eval()
        model.generation_config.eos_token_id = None
        extra = {}
        if args.workload == "hf-assisted":
            extra = {"assistant_model": AutoModelForCausalLM.from_pretrained(args.draft,
                                                                           dtype=getattr(torch, args.dtype)).eval(),
                     "num_assistant_tokens": args.k, "num_assistant_tokens_schedule": "constant"}
        x = torch.tensor(bench_models.token_prompts(tok, [cfg["prompt"]], seed=7))
        with torch.inference_mode():
            model.generate(x, do_sample=False, max_new_tokens=4, **extra)
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                model.generate(x, do_sample=False, max_new_tokens=cfg["tokens"], **extra)
        print(f"hf {args.workload}: {(time.perf_counter() - t0) / args.repeats:.2f}s per run of {cfg['tokens']} tokens",
              file=sys.stderr)
        return
    from speculant import LLM, SamplingParams

    kw: dict = {"linear_backend": args.linear_backend} if args.linear_backend else {}
    kw["dtype"] = args.dtype
    kw["enable_prefix_caching"] = False  # repeated runs of one prompt: profile prefill, not cache hits
    if args.workload == "spec-decode":
        kw["speculative"] = {"proposer": "draft_model", "num_speculative_tokens": args.k,
                             "proposer_options": {"model": str(args.draft)}}
    llm = LLM(model=str(model_dir), **kw)
    if args.workload in ("decode", "spec-decode"):
        prompts = bench_models.token_prompts(tok, [cfg["prompt"]], seed=7)
        params = [SamplingParams(temperature=0.0, max_tokens=cfg["tokens"], ignore_eos=True)]
    else:
        pairs = bench_models.mixed_workload(cfg["requests"], cfg["prange"], cfg["orange"])
        prompts = bench_models.token_prompts(tok, [p for p, _ in pairs], seed=11)
        params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for _, o in pairs]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        llm.generate(prompts, params, use_tqdm=False)
    dt = (time.perf_counter() - t0) / args.repeats
    metrics = llm.get_metrics()
    steps = metrics.get("num_engine_steps", metrics.get("num_steps", 0))
    print(f"speculant {args.workload}: {dt:.2f}s, {sum(p.max_tokens for p in params)} output tokens, "
          f"{steps} engine steps in total", file=sys.stderr)


def main() -> None:
    ap = harness.arg_parser(__doc__, out=None, repeats=1, dtype="float32",
                           quick="the quick model, a 16-token decode or 8 short requests",
                           cache_dir=bench_models.DEFAULT_CACHE_DIR)
    ap.add_argument("--out", type=Path, default=None, help="JSON file for the stage counts and hottest frames")
    ap.add_argument("--workload", choices=("decode", "spec-decode", "throughput", "hf-decode", "hf-assisted"),
                    default="decode")
    ap.add_argument("--target", default=None, help="local model dir instead of the benchmark model")
    ap.add_argument("--draft", default=None, help="draft model dir (spec-decode, hf-assisted)")
    ap.add_argument("--k", type=int, default=4, help="speculative tokens per step (spec-decode, hf-assisted)")
    ap.add_argument("--linear-backend", choices=("auto", "default", "onednn"), default=None)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--cprofile", action="store_true", help="use cProfile instead of py-spy")
    ap.add_argument("--top", type=int, default=12, help="hottest leaf frames to list")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workload in ("spec-decode", "hf-assisted") and not args.draft:
        ap.error(f"--workload {args.workload} needs --draft DIR (the draft model directory)")
    if args._child:
        run_workload(args)
        return
    child = [sys.executable, __file__, "--_child", "--workload", args.workload, "--cache-dir", str(args.cache_dir)]
    child += ["--quick"] * args.quick + (["--threads", str(args.threads)] if args.threads else [])
    child += ["--linear-backend", args.linear_backend] if args.linear_backend else []
    child += (["--target", args.target] if args.target else []) + (["--draft", args.draft] if args.draft else [])
    child += ["--k", str(args.k), "--repeats", str(args.repeats), "--dtype", args.dtype]
    bench = harness.start("profile_engine", args)  # the environment of the parent (the child pins the same threads)
    if args.cprofile:
        subprocess.run([sys.executable, "-m", "cProfile", "-s", "cumulative", *child[1:]], check=True)
        return
    if shutil.which("py-spy") is None:
        sys.exit("py-spy not found on PATH: pip install py-spy, or pass --cprofile")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        subprocess.run(["py-spy", "record", "--idle", "-r", str(args.rate), "--format", "raw", "-o", str(raw),
                        "--", *child], check=True, stdout=subprocess.DEVNULL)
        root = ROOT_MARKERS["hf" if args.workload.startswith("hf-") else "speculant"]
        stages, total, leaves = fold(raw, root)
    if not total:
        sys.exit("no samples under the generate call; is py-spy allowed to trace (ptrace)?")
    if args.out:
        bench.write({"workload": args.workload, "rate_hz": args.rate, "samples": total,
                     "stages": dict(stages.most_common()), "top_frames": dict(leaves.most_common(args.top))})
    print(f"\n{args.workload}: {total} samples at {args.rate}/s (~{total / args.rate:.1f}s), "
          f"load average {bench.env['load_avg']} at start\n")
    rows = [[name, n, f"{100 * n / total:.1f}%"] for name, n in stages.most_common()]
    print(harness.markdown_table(["stage", "samples", "share"], rows))
    print("\nhottest leaf frames (Python level; native work shows as its caller):\n")
    rows = [[f"`{frame[:110]}`", f"{100 * n / total:.1f}%"] for frame, n in leaves.most_common(args.top)]
    print(harness.markdown_table(["frame", "share"], rows))


if __name__ == "__main__":
    main()
