"""EAGLE head on SmolLM2-135M-Instruct: acceptance and end-to-end speed.

Held-out chat prompts (``scripts/eagle_training/chat_prompts.py``: none asks
to copy or edit text from the prompt), rendered with the model's chat
template; batch size 1 (one request at a time), greedy, 128 new tokens (EOS
ignored, so every run emits the same number of tokens). Configurations: no
speculation and EAGLE at k = ``--k``, each with chunked prefill off and on
(on: a ``--chunk`` token budget, so every prompt is split into several
chunks); with ``--hybrid`` also ``eagle_suffix`` both ways (its suffix part
without the global cache of past outputs, which would replay the repeated
prompts: per-request matches only). Configurations are
loaded once and run in ``--repeats`` rounds (``harness.rounds``: each once per
round, the order reversed every other round); each figure is the median over
rounds. Per run: wall time of all prompts, tokens/s, verify steps,
tokens per verify step (accepted + bonus), and the engine's propose / score
time (where the time goes); each chunked row also gets its ratio to the
unchunked row round by round (both ran back to back). Greedy outputs are
checked identical across configurations.

    nice -n 10 python benchmarks/eagle_bench.py --head models/smollm2-eagle --out benchmarks/results/eagle_smollm2.json
"""

from __future__ import annotations

import sys
import time

import harness

sys.path.insert(0, str(harness.REPO_ROOT / "scripts"))
from eagle_training.chat_prompts import HELDOUT
from speculant import LLM, SamplingParams

COUNTERS = ("num_steps", "num_draft_tokens", "num_accepted_tokens", "propose_s", "score_s", "accept_s",
            "num_engine_steps")


def build(args, chunked: bool, proposer: str | None) -> LLM:
    kw = dict(model=args.target, dtype=args.dtype, max_num_seqs=1, enable_chunked_prefill=chunked,
              max_num_batched_tokens=args.chunk if chunked else 512,
              enable_prefix_caching=False)  # every round repeats the prompts: time prefill, not cache hits
    if proposer is not None:
        eagle = {"path": args.head, "confidence_threshold": args.confidence}
        # no global cache of past outputs: every round repeats the same prompts, which it would replay
        options = eagle if proposer == "eagle" else {"eagle": eagle, "suffix": {"max_cached_requests": 0}}
        kw["speculative"] = {"proposer": proposer, "num_speculative_tokens": args.k, "proposer_options": options}
    return LLM(**kw)


def one_run(llm: LLM, prompts: list[str], params: SamplingParams) -> dict:
    before = llm.get_metrics()
    t0 = time.perf_counter()
    outs = [llm.chat([{"role": "user", "content": p}], params, use_tqdm=False)[0] for p in prompts]
    wall = time.perf_counter() - t0
    after = llm.get_metrics()
    d = {k: after[k] - before[k] for k in COUNTERS}
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    new = sum(len(t) for t in tokens)
    run = {"wall_s": wall, "tokens_per_s": new / wall, "new_tokens": new, "engine_steps": d["num_engine_steps"],
           "propose_s": d["propose_s"], "score_s": d["score_s"], "accept_s": d["accept_s"], "_tokens": tokens}
    if d["num_steps"]:
        run["tokens_per_verify_step"] = (d["num_accepted_tokens"] + d["num_steps"]) / d["num_steps"]
        run["acceptance_rate"] = d["num_accepted_tokens"] / d["num_draft_tokens"]
    return run


def chat_rounds(llms: dict[str, LLM], repeats: int, prompts: list[str],
                params: SamplingParams) -> tuple[dict[str, list[dict]], dict[str, list[list[int]]]]:
    """Warm every engine up, then ``one_run`` each per round (``harness.rounds``): (the runs
    by configuration, each configuration's output tokens of its first round)."""
    for llm in llms.values():  # warm-up (kernels, oneDNN shapes) on a prompt that is not timed
        harness.warm_up(llm, chat=True, max_tokens=16)
    runs = harness.rounds(list(llms), repeats, lambda name: one_run(llms[name], prompts, params),
                          lambda run: f"{run['tokens_per_s']:.1f} tok/s "
                                      f"{run.get('tokens_per_verify_step', 0):.2f} tok/step")
    outputs = {name: rs[0]["_tokens"] for name, rs in runs.items()}
    for rs in runs.values():
        for r in rs:
            r.pop("_tokens", None)
    return runs, outputs


def median_of(runs: list[dict]) -> dict:
    return {k: round(harness.median([r[k] for r in runs]), 4) for k in runs[0]}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "eagle_smollm2.json", repeats=3, dtype="float32")
    ap.add_argument("--target", default=None, help="GGUF file or HF directory (default: the SmolLM2 wheel's GGUF)")
    ap.add_argument("--head", default="models/smollm2-eagle")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--confidence", type=float, default=0.0,
                    help="the head's confidence_threshold (0: always draft k)")
    ap.add_argument("--hybrid", action="store_true", help="also eagle_suffix (the head behind suffix decoding)")
    ap.add_argument("--chunk", type=int, default=16, help="token budget with chunked prefill on")
    ap.add_argument("--prompts", type=int, default=10, help="how many held-out chat prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    args.target = args.target or harness.smollm2_path()
    prompts = HELDOUT[:args.prompts]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    configs: dict[str, tuple[bool, str | None]] = {"no_spec": (False, None), "no_spec_chunked": (True, None),
                                                   "eagle": (False, "eagle"), "eagle_chunked": (True, "eagle")}
    if args.hybrid:
        configs.update({"eagle_suffix": (False, "eagle_suffix"), "eagle_suffix_chunked": (True, "eagle_suffix")})
    bench = harness.start("eagle_smollm2", args)
    llms = {name: build(args, *c) for name, c in configs.items()}
    runs, outputs = chat_rounds(llms, args.repeats, prompts, params)
    results = {n: median_of(rs) for n, rs in runs.items()}
    base = results["no_spec"]["tokens_per_s"]
    for res in results.values():
        res["speedup_vs_no_spec"] = round(res["tokens_per_s"] / base, 3)
    for name in [n for n in configs if n.endswith("_chunked")]:
        plain = name[:-len("_chunked")]
        ratios = harness.per_round_ratios(runs, name, plain, "tokens_per_s")  # same round: same machine state
        results[name]["vs_unchunked"] = round(results[name]["tokens_per_s"] / results[plain]["tokens_per_s"], 3)
        results[name]["vs_unchunked_per_round"] = [round(x, 3) for x in ratios]
        results[name]["vs_unchunked_median_of_rounds"] = round(harness.median(ratios), 3)
    identical = all(outputs[n] == outputs["no_spec"] for n in configs)
    per_position = llms["eagle"].get_metrics()["acceptance_per_position"]
    bench.write({"target": args.target, "head": args.head,
                 "settings": {"dtype": args.dtype, "k": args.k, "confidence_threshold": args.confidence,
                              "chunk_budget": args.chunk, "prompts": len(prompts),
                              "max_tokens": args.max_tokens, "repeats": args.repeats, "batch_size": 1,
                              "greedy": True, "ignore_eos": True},
                 "greedy_outputs_identical": identical, "acceptance_per_position": per_position,
                 "results": results, "runs": runs})
    rows = [[n, f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_no_spec']:.2f}x",
             f"{r.get('tokens_per_verify_step', 1.0):.2f}", f"{r['propose_s']:.1f}", f"{r['score_s']:.1f}"]
            for n, r in results.items()]
    print(f"{bench.env['cpu']}, {bench.env['date_utc'][:10]}, {args.dtype}, k={args.k}, outputs identical: {identical}")
    print(harness.markdown_table(["config", "tok/s", "speedup", "tok/verify step", "propose s", "score s"], rows))


if __name__ == "__main__":
    main()
