"""``speculant chat``: an interactive conversation, streamed as tokens are accepted.

Each line read is a user turn; the reply streams as the engine accepts tokens
(several per step when speculation pays), then one summary line: tokens,
tokens/s, and with speculation the acceptance rate and tokens per verify step.
``/reset`` starts a new conversation, ``/exit`` (or end of input) quits. Input
that is not a terminal (a pipe, a file) is read the same way, a turn per line.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from speculant.config.models import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with a model, streaming tokens as they are accepted",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="engine config file (.toml, .yaml)")
    src.add_argument("--model", help="local Hugging Face model directory")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value, e.g. --set speculative.num_speculative_tokens=3")
    p.add_argument("--system", default=None, help="a system message opening every conversation")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(func=run)


def stream_reply(llm, conversation: list[dict], params, write: Callable[[str], None]) -> tuple[str, dict]:
    """Generate the assistant's reply to ``conversation``, writing text as it
    becomes stable; return the reply and its summary."""
    from speculant.chat import render

    engine = llm.engine
    prompt = render(llm.tokenizer, conversation)
    engine.stream_text = True
    printed, start = "", time.perf_counter()
    stream = None
    try:
        stream = llm.loop.stream(prompt, params)
        for out in stream:
            text = out.outputs[0].text
            write(text[len(printed):] if text.startswith(printed) else text)
            printed = text
            if out.finished:
                if out.outputs[0].finish_reason == "error":
                    raise RuntimeError(out.outputs[0].error or "the request failed")
                return text, _summary(out, time.perf_counter() - start, llm.config.speculative.enabled)
        raise RuntimeError("the reply ended without a finished output")
    except BaseException:
        if stream is not None:
            llm.loop.abort(stream.request_id)
        raise
    finally:
        engine.stream_text = False


def _summary(out, seconds: float, speculative: bool) -> dict:
    n = len(out.outputs[0].token_ids)
    summary = {"tokens": n, "seconds": round(seconds, 3), "tokens_per_s": round(n / seconds, 1) if seconds else None}
    if speculative and out.metrics:
        summary.update(acceptance_rate=round(out.metrics["acceptance_rate"], 3),
                       tokens_per_step=round(out.metrics["mean_accepted_length"], 2))
    return summary


def _write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    from speculant.cli.generate_cmd import _build
    from speculant.config.sampling_params import SamplingParams

    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed)
        llm = _build(args, args.overrides)
    except (ConfigError, ValueError, OSError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    opening = [{"role": "system", "content": args.system}] if args.system else []
    conversation = list(opening)
    interactive = sys.stdin.isatty()
    if interactive:
        print("type a message; /reset starts over, /exit or Ctrl-D quits", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", flush=True, file=sys.stderr)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        line = line.rstrip("\n")
        if line.strip() == "/reset":
            conversation = list(opening)
            continue
        if not line.strip():
            continue
        conversation.append({"role": "user", "content": line})
        try:
            reply, summary = stream_reply(llm, conversation, params, _write_out)
        except (ValueError, TypeError, RuntimeError) as exc:
            print(f"\nerror: {exc}", file=sys.stderr)
            conversation.pop()
            if isinstance(exc, ValueError) and "chat template" in str(exc):
                return 2
            continue
        conversation.append({"role": "assistant", "content": reply})
        print("\n[" + " | ".join(f"{k}: {v}" for k, v in summary.items()) + "]", flush=True)
