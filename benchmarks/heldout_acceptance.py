"""Tokens per verify step of every trained proposer on SmolLM2-135M-Instruct's
20 held-out chat prompts (``scripts/eagle_training/chat_prompts.py``: none asks
to copy from the prompt, none is in the proposers' training data).

Greedy, 128 new tokens (EOS ends a reply), k = ``--k``, 8 requests at a time;
the suffix proposers keep their global cache of finished replies (each prompt
runs once, so it only holds other prompts' replies). Acceptance does not
depend on speed, so this needs no quiet machine; every proposer's tokens are
checked identical to no speculation.

    python benchmarks/heldout_acceptance.py --out benchmarks/results/heldout_tokens_per_step_smollm2.json
"""

from __future__ import annotations

import sys

import harness

sys.path.insert(0, str(harness.REPO_ROOT / "scripts"))
from eagle_training.chat_prompts import HELDOUT
from speculant import LLM, SamplingParams


def proposers(eagle: str, draft: str | None) -> dict[str, dict | None]:
    specs: dict[str, dict | None] = {"no_spec": None, "ngram": {"proposer": "ngram"}, "suffix": {"proposer": "suffix"}}
    if draft:  # no SmolLM2 draft ships (docs/proposers.md: train one with scripts/train_draft.py)
        specs["draft_model"] = {"proposer": "draft_model", "proposer_options": {"model": draft}}
        specs["draft_suffix"] = {"proposer": "draft_suffix", "proposer_options": {"draft": {"model": draft}}}
    specs["eagle"] = {"proposer": "eagle", "proposer_options": {"path": eagle}}
    specs["eagle_suffix"] = {"proposer": "eagle_suffix", "proposer_options": {"eagle": {"path": eagle}}}
    return specs


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "heldout_tokens_per_step_smollm2.json",
                           dtype="float32")
    ap.add_argument("--target", default=None, help="GGUF file or HF directory (default: the SmolLM2 wheel's GGUF)")
    ap.add_argument("--eagle", default="models/smollm2-eagle")
    ap.add_argument("--draft", default=None, help="a SmolLM2 draft directory (adds the draft rows)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    target = args.target or harness.smollm2_path()
    bench = harness.start("heldout_acceptance", args, busy_warning=False)  # acceptance: any load will do
    chats = [[{"role": "user", "content": p}] for p in HELDOUT]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    results: dict[str, dict] = {}
    reference = None
    for name, spec in proposers(args.eagle, args.draft).items():
        kw = {"speculative": {**spec, "num_speculative_tokens": args.k}} if spec else {}
        llm = LLM(model=target, dtype=args.dtype, max_num_seqs=8, max_num_batched_tokens=1024, **kw)
        tokens = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]
        reference = reference or tokens
        m = llm.get_metrics()
        results[name] = {"identical_to_no_spec": tokens == reference,
                         "acceptance_rate": round(m.get("acceptance_rate") or 0.0, 4),
                         "tokens_per_verify_step": round(m.get("mean_accepted_length") or 1.0, 3)}
        print(name, results[name], flush=True)
    bench.write({"target": target, "eagle": args.eagle, "draft": args.draft,
                 "settings": {"dtype": args.dtype, "k": args.k, "max_tokens": args.max_tokens,
                              "prompts": len(HELDOUT), "greedy": True, "max_num_seqs": 8},
                 "results": results})
    print(f"{bench.env['cpu']}, {bench.env['date_utc'][:10]}, {args.dtype}, k={args.k}")
    print(harness.markdown_table(["proposer", "tokens per verify step", "acceptance", "identical"],
                                [[n, f"{r['tokens_per_verify_step']:.2f}", f"{r['acceptance_rate']:.3f}",
                                  str(r["identical_to_no_spec"])] for n, r in results.items()]))


if __name__ == "__main__":
    main()
