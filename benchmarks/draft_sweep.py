"""The distilled draft's knobs on SmolLM2-135M-Instruct at batch 1: k, confidence
threshold and the draft's dtype, side by side with no speculation.

Every config is one engine built up front; rounds run each config once over the
same held-out chat prompts (order reversed every other round, so drift hits all
alike) and tok/s is the median of the rounds. Greedy, EOS ignored, float32 target,
batch-expansion scoring (the draft's faster scorer in ``speculant bench``); every
config's tokens are checked identical to no speculation.

    python benchmarks/draft_sweep.py --threads 2 --out benchmarks/results/draft_sweep_smollm2.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from eagle_bench import smollm2_path

from common import environment, markdown_table, write_json
from eagle_training.chat_prompts import HELDOUT
from speculant import LLM, SamplingParams


def configs(draft: str) -> dict[str, dict | None]:
    def spec(k: int = 4, confidence: float = 0.4, **options) -> dict:
        return {"proposer": "draft_model", "num_speculative_tokens": k, "scorer": "batch_expansion",
                "proposer_options": {"model": draft, "confidence_threshold": confidence, **options}}

    return {"none": None, "k4": spec(), "k3": spec(k=3), "k2": spec(k=2), "k4_conf0.25": spec(confidence=0.25),
            "k4_conf0.6": spec(confidence=0.6), "k4_draft_bf16": spec(dtype="bfloat16")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="GGUF file or HF directory (default: the SmolLM2 wheel's GGUF)")
    ap.add_argument("--draft", required=True, help="a SmolLM2 draft directory (scripts/train_draft.py)")
    ap.add_argument("--prompts", type=int, default=3, help="how many held-out chat prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/draft_sweep_smollm2.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = args.target or smollm2_path()
    env = environment()
    llms = {}
    for name, spec in configs(args.draft).items():
        cfg: dict = {"model": {"path": target, "dtype": "float32"}}
        if spec:
            cfg["speculative"] = spec
        llms[name] = LLM.from_dict(cfg)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    chats = [[{"role": "user", "content": p}] for p in HELDOUT[:args.prompts]]
    rates: dict[str, list[float]] = {n: [] for n in llms}
    steps: dict[str, float | None] = {}
    outputs: dict[str, list] = {}
    for r in range(args.rounds):
        for name in (list(llms) if r % 2 == 0 else list(llms)[::-1]):
            llm = llms[name]
            llm.engine.reset_metrics()
            t0 = time.perf_counter()
            outs = [llm.chat(c, params, use_tqdm=False)[0] for c in chats]
            seconds = time.perf_counter() - t0
            tokens = [list(o.outputs[0].token_ids) for o in outs]
            rates[name].append(sum(map(len, tokens)) / seconds)
            steps[name] = llm.get_metrics().get("mean_accepted_length") if name != "none" else 1.0
            outputs[name] = tokens
            print(f"round {r} {name}: {rates[name][-1]:.1f} tok/s", file=sys.stderr)
    base = statistics.median(rates["none"])
    results = {n: {"tok_per_s": statistics.median(v), "tok_per_s_rounds": [round(x, 2) for x in v],
                   "vs_no_spec": statistics.median(v) / base, "tokens_per_verify_step": steps[n],
                   "identical_to_no_spec": outputs[n] == outputs["none"]} for n, v in rates.items()}
    write_json(args.out, {"benchmark": "draft_sweep", "environment": env, "target": target, "draft": args.draft,
                          "settings": vars(args) | {"out": str(args.out)}, "configs": configs(args.draft),
                          "results": results})
    print(f"{env['cpu']}, {env['date_utc'][:16]}, float32 target, batch 1")
    print(markdown_table(["config", "tok/s", "vs none", "tokens per verify step", "identical"],
                         [[n, f"{r['tok_per_s']:.1f}", f"{r['vs_no_spec']:.2f}x", f"{r['tokens_per_verify_step']:.2f}",
                           r["identical_to_no_spec"]] for n, r in results.items()]))


if __name__ == "__main__":
    main()
