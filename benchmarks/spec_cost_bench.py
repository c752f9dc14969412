"""Speculation that never costs (issue 50): the adaptive default against fixed
k and against no speculation, on SmolLM2-135M-Instruct.

Workloads (``--workload``):

* ``chat``: open chat at temperature 1.0, top-p 0.95, ``--max-tokens`` (128)
  tokens, one request at a time (4 prompts, seeded): no speculation, then each
  proposer (``--proposer``: ngram, suffix, draft_model, eagle) with the fixed
  policy and with the adaptive default. The draft model is SmolLM2 cut to its
  first layers (``smollm2_draft.py``, built at bench time into the cache).
* ``edits``: code edits at temperature 0 (4 edit tasks of ``repeated_tasks.py``),
  one at a time: the proposer at fixed k = 2, 4, 8 and adaptive (the default,
  k <= 8, and k <= 4). Tokens must equal no speculation's (checked).
* ``mixed``: 32 requests at once, half edits at temperature 0 and half open
  chat at temperature 1: all off, all on (fixed k), the adaptive default, and
  the adaptive default with the chat half sending ``{"enabled": false}``. The
  greedy half must equal no speculation's (checked).

Each configuration keeps one engine (loaded once, warmed up); rounds run every
configuration once, alternating the order (``harness.rounds``); the figure is
the median over rounds of output tokens / wall seconds, each configuration's
speedup the median of its per-round ratio to no speculation in the same round,
with the min-max spread. Every run also records the per-request acceptance
histogram summed over its requests.

    /tmp/q/bench python benchmarks/spec_cost_bench.py --workload chat --proposer suffix --out ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness
from repeated_tasks import conversations

CHAT = [
    "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
    "What would you do with a free afternoon in a city you have never visited?",
    "Describe your ideal weekend breakfast and why you like it.",
    "Write a few lines about the sea at night.",
]
EAGLE = Path(__file__).resolve().parents[1] / "models" / "smollm2-eagle"


DRAFT_LAYERS = 8
"""Layers of the target the draft model keeps (``smollm2_draft.py``)."""


def proposer(name: str) -> dict[str, Any]:
    """The speculative settings of one proposer row (the draft model is built on first use)."""
    if name == "ngram":
        return {"proposer": "ngram", "proposer_options": {"min_n": 2, "max_n": 4}}
    if name == "suffix":
        return {"proposer": "suffix"}
    if name == "eagle":
        return {"proposer": "eagle", "proposer_options": {"path": str(EAGLE)}}
    if name == "draft_model":
        from smollm2_draft import truncated_draft

        return {"proposer": "draft_model", "proposer_options": {"model": truncated_draft(DRAFT_LAYERS)}}
    raise SystemExit(f"--proposer {name!r}: pick ngram, suffix, draft_model or eagle")


FIXED = {"policy": "fixed"}


def configs(workload: str, names: list[str]) -> dict[str, dict[str, Any] | None]:
    if workload == "chat":
        out: dict[str, dict[str, Any] | None] = {"none": None}
        for name in names:
            p = proposer(name)
            out[f"{name}_fixed_k4"] = {**p, "num_speculative_tokens": 4, "draft_length": FIXED}
            out[f"{name}_adaptive"] = {**p}  # the default: adaptive, k <= 8
        return out
    (name,) = names
    p = proposer(name)
    if workload == "edits":
        return {"none": None, **{f"{name}_fixed_k{k}": {**p, "num_speculative_tokens": k, "draft_length": FIXED}
                                 for k in (2, 4, 8)},
                f"{name}_adaptive": {**p}, f"{name}_adaptive_k4": {**p, "num_speculative_tokens": 4}}
    return {"all_off": None, f"{name}_fixed_k4": {**p, "num_speculative_tokens": 4, "draft_length": FIXED},
            f"{name}_adaptive": {**p},
            f"{name}_adaptive_chat_off": {**p}}


def requests(workload: str, max_tokens: int, config: str, num: int = 4) -> tuple[list[Any], list[Any]]:
    """(conversations, SamplingParams) of one run."""
    from speculant import SamplingParams

    def chat(i: int, off: bool = False) -> SamplingParams:
        return SamplingParams(temperature=1.0, top_p=0.95, max_tokens=max_tokens, seed=i, ignore_eos=True,
                              speculative={"enabled": False} if off else None)

    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    edits = conversations("edit")
    if workload == "chat":
        return [[{"role": "user", "content": c}] for c in CHAT[:num]], [chat(i) for i in range(num)]
    if workload == "edits":
        return edits[:num], [greedy] * num
    off = config.endswith("chat_off")
    convs = [edits[i % len(edits)] for i in range(16)] + [[{"role": "user", "content": CHAT[i % 4]}]
                                                          for i in range(16)]
    return convs, [greedy] * 16 + [chat(i, off) for i in range(16)]


def run_one(llm, workload: str, max_tokens: int, config: str, num: int) -> dict[str, Any]:
    convs, params = requests(workload, max_tokens, config, num)
    llm.engine.reset_metrics()
    if workload == "mixed":  # all at once
        outs = llm.chat(convs, params, use_tqdm=False)
        seconds = llm.last_run_seconds
    else:  # one request at a time
        outs, seconds = [], 0.0
        for conv, sp in zip(convs, params):
            outs += llm.chat([conv], sp, use_tqdm=False)
            seconds += llm.last_run_seconds
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    m = llm.get_metrics()
    return {"tok_per_s": sum(len(t) for t in tokens) / seconds, "seconds": seconds,
            "tokens": tokens, "greedy": [sp.temperature == 0 for sp in params],
            "accepted_length_histogram": m.get("accepted_length_histogram", []),
            "num_draft_tokens": m.get("num_draft_tokens", 0), "num_accepted_tokens": m.get("num_accepted_tokens", 0),
            "num_off_steps": m.get("num_off_steps", 0), "propose_s": m.get("propose_s", 0.0),
            "mean_planned_draft_length": m.get("mean_planned_draft_length"),
            "cost_curve": m.get("cost_curve"), "draft_token_cost": m.get("draft_token_cost")}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "spec_cost.json", repeats=5, dtype="bfloat16",
                            threads=2)
    ap.add_argument("--workload", choices=["chat", "edits", "mixed"], required=True)
    ap.add_argument("--proposer", default=None,
                    help="comma-separated proposers (ngram, suffix, draft_model, eagle); chat: default all four, "
                         "edits and mixed: one (default suffix)")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 128 (chat, edits), 64 (mixed)")
    ap.add_argument("--prompts", type=int, default=4, help="chat and edits: requests per run (at most 4)")
    ap.add_argument("--only", default=None, help="comma-separated configurations to run (the first is the base)")
    args = ap.parse_args()
    names = (args.proposer or ("ngram,suffix,draft_model,eagle" if args.workload == "chat" else "suffix")).split(",")
    if args.out == getattr(args, "_default_out", None):
        args.out = harness.RESULTS_DIR / f"spec_cost_{args.workload}_{'_'.join(names)}.json"
    max_tokens = args.max_tokens or (64 if args.workload == "mixed" else 128)
    bench = harness.start("spec_cost", args)
    cfgs = configs(args.workload, names)
    if args.only:
        cfgs = {name: cfgs[name] for name in args.only.split(",")}
    llms = {}
    from speculant import LLM

    for name, spec in cfgs.items():  # a 0.25 GiB KV pool each (11k tokens): several engines stay in memory
        llms[name] = LLM.from_dict({"model": {"path": harness.smollm2_path(), "dtype": args.dtype,
                                              "quantization": "dequantize"},  # the GGUF's weights as bf16
                                    "cache": {"memory_gb": 0.25}, "speculative": spec or {}})
        harness.warm_up(llms[name], chat=True)
        bench.log(f"loaded {name}")
    runs = harness.rounds(list(cfgs), args.repeats,
                          lambda n: run_one(llms[n], args.workload, max_tokens, n, args.prompts),
                          describe=lambda r: f"{r['tok_per_s']:.1f} tok/s")
    base = next(iter(cfgs))
    reference = runs[base][0]
    rows = {}
    for name, rs in runs.items():
        ratios = harness.per_round_ratios(runs, name, base, "tok_per_s")
        same = all(a == b for r in rs for a, b, g in zip(r["tokens"], reference["tokens"], r["greedy"]) if g)
        hist: list[int] = []
        for r in rs:
            for a, n in enumerate(r["accepted_length_histogram"]):
                hist += [0] * (a + 1 - len(hist))
                hist[a] += n
        last = rs[-1]
        rows[name] = {"tok_per_s": harness.summary([r["tok_per_s"] for r in rs], 2),
                      "speedup_vs_" + base: harness.summary(ratios, 4),
                      "greedy_tokens_equal_" + base: same, "accepted_length_histogram": hist,
                      "num_draft_tokens": sum(r["num_draft_tokens"] for r in rs),
                      "num_accepted_tokens": sum(r["num_accepted_tokens"] for r in rs),
                      "num_off_steps": sum(r["num_off_steps"] for r in rs),
                      "mean_planned_draft_length": last["mean_planned_draft_length"],
                      "cost_curve": last["cost_curve"], "draft_token_cost": last["draft_token_cost"]}
        s = rows[name]["speedup_vs_" + base]
        bench.log(f"{name:>28}: {rows[name]['tok_per_s']['median']:7.1f} tok/s, x{s['median']:.3f} "
                  f"({s['min']:.3f}-{s['max']:.3f}), greedy equal: {same}, accepted per verify step: "
                  + " ".join(f"{a}:{n}" for a, n in enumerate(hist)))
    bench.write({"model": f"SmolLM2-135M-Instruct ({args.dtype})", "workload": args.workload,
                 "max_tokens": max_tokens, "prompts": args.prompts,
                 "draft_model": f"SmolLM2-135M's first {DRAFT_LAYERS} of 30 layers + final norm + LM head "
                                "(smollm2_draft.py, built at bench time)",
                 "rows": rows})


if __name__ == "__main__":
    main()
