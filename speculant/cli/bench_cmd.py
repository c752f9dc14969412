"""``speculant bench``: Speculant vs transformers, side by side on one model pair.

The measuring code lives in ``speculant.bench``; this module only parses the
options, checks the paths and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {text!r}")
    return values


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="benchmark Speculant against transformers",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Greedy tokens/s, acceptance and inter-token latency on the same prompts (EOS ignored).\n\n"
                    "Speculant rows: no_spec, ngram, suffix, suffix_adaptive (adaptive draft length),\n"
                    "  draft_mqa, draft_batch_expansion and draft_suffix (with --draft),\n"
                    "  medusa / mlp_speculator / eagle (with --medusa / --mlp-speculator / --eagle: MQA scoring,\n"
                    "  k capped to the number of tokens the heads predict; with --eagle also eagle_adaptive and\n"
                    "  eagle_suffix).\n"
                    "transformers rows: generate (batch 1; at concurrency > 1 one static left-padded batch),\n"
                    "  assisted and prompt_lookup (batch 1 only), continuous_batching (concurrency > 1 only:\n"
                    "  transformers 5 generate_batch; 'unsupported: <reason>' where unavailable).\n"
                    "A row that raised is 'error: <type>: <message>'.\n\n"
                    "Writes JSON (--out), a PNG chart (--chart; needs matplotlib: pip install "
                    "'speculant[bench]')\nand prints a Markdown table.")
    p.add_argument("--target", default=None, help="local Hugging Face target model directory, or a .gguf file "
                                                  "(converted once into a cached directory)")
    p.add_argument("--random-llama", default=None, choices=("1b", "8b", "tiny"),
                   help="instead of --target: a random-weight llama of this size built on the device from a "
                        "config (nothing downloaded), with the oracle proposer at --alpha; transformers runs the same "
                        "random weights (same config and seed) unless --no-hf")
    p.add_argument("--alpha", default="0.8", metavar="A[,A...]",
                   help="--random-llama: the oracle proposer's per-token acceptance probabilities (default 0.8)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where both engines run (default auto: CUDA when torch sees one, else the CPU)")
    p.add_argument("--draft", default=None, help="local draft model directory or .gguf file (same tokenizer); "
                                                  "draft rows are skipped without it")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="both engines' model dtype (default float32)")
    p.add_argument("--chat", action="store_true",
                   help="each prompt is one user message, rendered with the target's chat template")
    p.add_argument("--medusa", default=None, metavar="DIR",
                   help="trained Medusa heads for the target (scripts/train_heads.py --kind medusa): adds "
                        "'medusa' rows")
    p.add_argument("--mlp-speculator", default=None, metavar="DIR",
                   help="trained MLP-speculator heads for the target (scripts/train_heads.py --kind "
                        "mlp_speculator): adds 'mlp_speculator' rows")
    p.add_argument("--eagle", default=None, metavar="DIR",
                   help="a trained EAGLE head for the target (scripts/train_eagle.py): adds 'eagle' rows")
    p.add_argument("--llamacpp", action="append", default=None, metavar="FILE.gguf",
                   help="add a llama.cpp row (batch 1) on this GGUF file; repeatable (needs llama-cpp-python)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="one prompt per line (a literal \\n in a line becomes a newline); "
                        "default: built-in code prompts")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens generated per prompt (default 64)")
    p.add_argument("--k", type=int, default=4, help="speculative tokens per step (default 4); medusa / "
                   "mlp_speculator rows use at most as many as their heads predict")
    p.add_argument("--draft-confidence", type=float, default=0.4, metavar="P",
                   help="draft rows (and --eagle): stop drafting after a proposal the draft gives probability "
                        "< P, in both engines (Speculant's confidence_threshold, transformers' "
                        "assistant_confidence_threshold; default 0.4, transformers' own default; 0 always drafts k)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per row; median reported (default 3)")
    p.add_argument("--concurrency", type=_concurrency, default=None, metavar="1,32",
                   help="concurrency levels (default 1,32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers rows")
    p.add_argument("--out", type=Path, default=Path("bench_results.json"), help="JSON result path")
    p.add_argument("--chart", type=Path, default=None, help="PNG chart path (default: --out with .png)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 8 tokens, 2 prompts, 1 repeat, concurrency 1, no batched transformers "
                        "rows (generate batch, continuous_batching)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speculant.bench import QUICK, load_prompts, run_bench
    from speculant.bench.chart import write_chart
    from speculant.bench.report import markdown_table, write_json
    from speculant.config.models import ConfigError

    if (args.target is None) == (args.random_llama is None):
        print("error: give exactly one of --target DIR|FILE.gguf and --random-llama SIZE", file=sys.stderr)
        return 2
    device = _device(args.device)
    if device is None:
        print("error: --device cuda: torch sees no CUDA device here; pass --device cpu or auto", file=sys.stderr)
        return 2
    if args.random_llama:
        return _run_random(args, device)
    for name, path in (("--target", args.target), ("--draft", args.draft)):
        if path is not None and not (Path(path) / "config.json").is_file() \
                and not (Path(path).is_file() and path.endswith(".gguf")):
            print(f"error: {name} {path}: neither a Hugging Face model directory (config.json) nor a .gguf file; "
                  "pass one of those", file=sys.stderr)
            return 2
    for name, path in (("--medusa", args.medusa), ("--mlp-speculator", args.mlp_speculator), ("--eagle", args.eagle)):
        if path is not None and not Path(path).is_dir():
            print(f"error: {name} {path}: no such directory; pass the directory of trained heads for the "
                  f"target (scripts/train_heads.py writes one)", file=sys.stderr)
            return 2
    for path in args.llamacpp or []:
        if not Path(path).is_file():
            print(f"error: --llamacpp {path}: no such file; pass a GGUF file llama.cpp can load", file=sys.stderr)
            return 2
    if args.k < 1:
        print(f"error: --k {args.k}: speculative tokens per step must be >= 1; pass --k 1 or more", file=sys.stderr)
        return 2
    if not 0.0 <= args.draft_confidence < 1.0:
        print(f"error: --draft-confidence {args.draft_confidence}: must be in [0, 1); pass 0 to always draft "
              "k tokens", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        prompts = load_prompts(args.prompts)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.quick:
        prompts = prompts[:QUICK["num_prompts"]]
    max_tokens = args.max_tokens or (QUICK["max_tokens"] if args.quick else 64)
    repeats = args.repeats or (QUICK["repeats"] if args.quick else 3)
    concurrency = args.concurrency or (QUICK["concurrency"] if args.quick else [1, 32])
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731 - progress to stderr, table to stdout
    try:
        result = run_bench(args.target, args.draft, prompts=prompts, max_tokens=max_tokens, k=args.k,
                           repeats=repeats, concurrency=concurrency, hf=not args.no_hf,
                           hf_batched=not args.quick, log=log,
                           heads={"medusa": args.medusa, "mlp_speculator": args.mlp_speculator,
                                  "eagle": args.eagle},
                           confidence=args.draft_confidence, dtype=args.dtype, chat=args.chat, device=device,
                           llamacpp=args.llamacpp, threads=args.threads)
    except (ConfigError, ValueError, FileNotFoundError, TypeError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["settings"]["quick"] = bool(args.quick)
    chart = args.chart or args.out.with_suffix(".png")
    note = write_chart(chart, result)
    result["chart"] = None if note else str(chart)
    if note:
        result["notes"].append(note)
    write_json(args.out, result)
    print(f"{result['env'].get('gpu') or result['env']['cpu']}, {result['env']['date_utc'][:10]}, {args.dtype}")
    print(markdown_table(result["rows"]))
    print()
    for r in result["rows"]:
        if r.get("accepted_length_histogram"):
            print(f"accepted per verify step, {r.get('method', '?')} c={r.get('concurrency', '?')}: "
                  + " ".join(f"{a}:{n}" for a, n in enumerate(r["accepted_length_histogram"])))
    for n in result["notes"]:
        print(f"- {n}")
    print(f"results: {args.out}" + (f", chart: {chart}" if not note else ""))
    return 0


def _device(choice: str) -> str | None:
    """``--device`` resolved once for both engines (None: CUDA asked for but absent)."""
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        return None
    return choice


def _run_random(args: argparse.Namespace, device: str) -> int:
    from speculant.bench.random_target import run_random_bench, write

    try:
        alphas = [float(a) for a in str(args.alpha).split(",")]
    except ValueError:
        alphas = []
    if not alphas or not all(0.0 <= a <= 1.0 for a in alphas):
        print(f"error: --alpha {args.alpha}: give probabilities in [0, 1], comma-separated", file=sys.stderr)
        return 2
    if args.k < 1:
        print(f"error: --k {args.k}: speculative tokens per step must be >= 1; pass --k 1 or more", file=sys.stderr)
        return 2
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731 - progress to stderr
    result = run_random_bench(args.random_llama, alphas=alphas, k=args.k, max_tokens=args.max_tokens or 128,
                              repeats=args.repeats or (1 if args.quick else 3), concurrency=args.concurrency or [1],
                              dtype=args.dtype, device=device, hf=not args.no_hf, log=log)
    write(args.out, result)
    print(result["title"])
    for r in result["rows"]:
        vs = f"{r['vs_baseline']:.2f}x" if r.get("vs_baseline") else "-"
        print(f"{r['method']:>14} c={r['concurrency']:<3} {r['status']:<4} "
              f"{(r.get('tokens_per_s') or 0):8.1f} tok/s  {vs:>6}  "
              f"tokens/step {(r.get('mean_accepted_length') or 1.0):.2f}")
    print(f"results: {args.out}")
    return 0
