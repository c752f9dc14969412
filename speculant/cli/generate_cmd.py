"""``speculant generate``: run prompts through the engine and print a summary."""

from __future__ import annotations

import argparse
import json
import sys

from speculant.config.models import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text from prompts",
                       description="Generate completions. Select the model with --config FILE "
                                   "(TOML/YAML) or --model DIR.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="engine config file (.toml, .yaml)")
    src.add_argument("--model", help="local Hugging Face model directory")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value, e.g. --set speculative.num_speculative_tokens=3")
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="SCHEMA|@FILE",
                       help="constrain the output to this JSON schema (JSON text, or @path to a file)")
    shape.add_argument("--regex", help="constrain the output to this regular expression")
    p.add_argument("--compare", action="store_true",
                   help="also run without speculation and report the speedup")
    p.add_argument("--chat", action="store_true",
                   help="send each prompt as a user message through the model's chat template")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--verbose", action="store_true",
                   help="also print how each model runs: which C kernels run on this CPU (and what is lost "
                        "where it lacks a feature), the forward path (model.fast_forward), "
                        "with its build and probe times, or why transformers' modules run it, and the "
                        "linear layers' kernel (model.linear_backend)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice, one per core)")
    p.set_defaults(func=run)


def _build(args, overrides: list[str]):
    from speculant.config.models import apply_overrides
    from speculant.llm import LLM

    if args.config:
        return LLM.from_config(args.config, overrides)
    return LLM.from_dict(apply_overrides({"model": {"path": args.model}}, overrides), "--model/--set")


def forward_paths(llm) -> list[str]:
    """One line per runner (the target, then any draft model): which forward path it takes."""
    runner = llm.engine.runner
    lines = [runner.kernel_report, f"model.fast_forward: {runner.fast_forward.describe()}",
             f"model.linear_backend: {runner.linear_report.describe()}",
             f"memory: {runner.huge_pages.describe()}", f"self-test: {runner.self_test.describe()}"]
    proposer = llm.engine.spec.proposer
    for part in getattr(proposer, "parts", [proposer]) if proposer is not None else []:
        draft = getattr(part, "runner", None)
        if draft is not None:
            lines.append(f"draft model.fast_forward: {draft.fast_forward.describe()}")
            lines.append(f"draft model.linear_backend: {draft.linear_report.describe()}")
    return lines


def _warm_up(llm, args) -> None:
    """One short untimed run, so one-time kernel setup is not counted as speed."""
    from speculant.config.sampling_params import SamplingParams

    llm.generate(args.prompts[:1], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
    llm.engine.reset_metrics()


def _run_once(llm, args, params):
    if args.compare:
        _warm_up(llm, args)
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(args.prompts, params, use_tqdm=False)
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    seconds = llm.last_run_seconds
    return outputs, num_tokens, seconds


def _structured(args: argparse.Namespace) -> dict | None:
    """``SamplingParams.structured`` from --json-schema / --regex (an @path schema is read from the file)."""
    if args.regex is not None:
        return {"regex": args.regex}
    if args.json_schema is None:
        return None
    text = args.json_schema
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    return {"json_schema": text}


def run(args: argparse.Namespace) -> int:
    from speculant.config.sampling_params import SamplingParams

    if args.threads is not None:
        if args.threads < 1:
            print(f"error: --threads {args.threads}: need at least 1 thread; omit it for torch's choice",
                  file=sys.stderr)
            return 2
        import torch

        torch.set_num_threads(args.threads)
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos,
                                structured=_structured(args))
        llm = _build(args, args.overrides)
        outputs, num_tokens, seconds = _run_once(llm, args, params)
    except (ConfigError, ValueError, OSError, TypeError) as exc:  # clear one-line errors, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    metrics = llm.get_metrics()
    summary = {"num_requests": len(outputs), "num_tokens": num_tokens, "seconds": round(seconds, 3),
               "tokens_per_s": round(num_tokens / seconds, 1) if seconds else None,
               "speculative": llm.config.speculative.proposer}
    if llm.config.speculative.enabled:
        summary.update(acceptance_rate=round(metrics["acceptance_rate"], 3),
                       mean_accepted_length=round(metrics["mean_accepted_length"], 3),
                       propose_s=round(metrics["propose_s"], 3), score_s=round(metrics["score_s"], 3),
                       accepted_length_histogram=metrics["accepted_length_histogram"],
                       spec_off_steps=metrics["num_off_steps"])
    if args.compare and llm.config.speculative.enabled:
        from speculant.config.models import SpeculativeConfig
        from speculant.llm import LLM

        base = LLM(config=llm.config.model_copy(update={"speculative": SpeculativeConfig()}))
        base_out, base_tokens, base_seconds = _run_once(base, args, params)
        summary["baseline_tokens_per_s"] = round(base_tokens / base_seconds, 1)
        summary["speedup"] = round((num_tokens / seconds) / (base_tokens / base_seconds), 2)
        summary["same_text_as_baseline"] = all(
            a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(outputs, base_out))
    if args.verbose:
        summary["forward_paths"] = [f"model.dtype = {llm.config.model.dtype_reason}", *forward_paths(llm)]
    if args.json:
        print(json.dumps({"outputs": [{"prompt": p if args.chat else o.prompt, "text": o.outputs[0].text,
                                       "finish_reason": o.outputs[0].finish_reason}
                                      for p, o in zip(args.prompts, outputs)],
                          "summary": summary}, indent=2))
        return 0
    for p, o in zip(args.prompts, outputs):
        print(f"{p}\n{o.outputs[0].text}" if args.chat else f"{o.prompt}{o.outputs[0].text}")
        print("-" * 60)
    paths = summary.pop("forward_paths", [])
    print(" | ".join(f"{k}: {v}" for k, v in summary.items()))
    for line in paths:
        print(line)
    return 0
