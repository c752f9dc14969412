"""Micro-benchmark of the verify hot path: ``gather_scores`` (logits -> Scores)
and ``step.decide`` (filter + accept) for one step of speculating decodes.

Default: 32 decodes, k = 4, V = 49152 (SmolLM2's vocabulary), random float32
logits on the CPU, median of ``--repeats`` timed calls after one warm-up. Cases:

* ``greedy``: every request greedy (``greedy_accept`` on the raw logits);
* ``temperature``: temperature 0.8, no draft probabilities (n-gram style),
  rejection sampling;
* ``temperature_draft_probs``: the same with full draft distributions;
* ``top_p``: temperature 0.8 and top-p 0.95 (a full sort of every row:
  the filter dominates);
* ``ragged_*``: as above but each decode proposes 0..k tokens (seeded), as
  the scheduler's trimming and confidence stops do.

Runs against whichever ``speculant`` is importable (``PYTHONPATH`` first), so
the same script measures an older checkout: ``--label before`` with
``PYTHONPATH`` pointing at an exported tree, ``--label after`` in place. Each
run is appended under its label in ``benchmarks/results/accept_layout.json``
with its environment (``harness.py``; an older checkout must have
``speculant.bench.report.environment``); ``summary_ms`` is the median over a
label's runs (alternate the labels on a shared machine).

    git archive <old commit> speculant | tar -x -C /tmp/before
    for i in 1 2 3; do
      PYTHONPATH=/tmp/before python benchmarks/accept_layout_bench.py --label before --threads 1
      python benchmarks/accept_layout_bench.py --label after --threads 1
    done
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

import harness
import speculant
from speculant.acceptance.rejection import RejectionSampler
from speculant.config.sampling_params import SamplingParams
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.request import Request, RequestStatus
from speculant.engine.step import decide
from speculant.interfaces.layout import gather_scores
from speculant.model.runner import ForwardOutput

try:  # the contract classes may live in core/interfaces.py
    from speculant.interfaces import Proposals
except ImportError:
    from speculant.proposers.base import Proposals


def make_batch(n: int, lens: list[int], params: SamplingParams) -> StepBatch:
    decodes = []
    for i, k in enumerate(lens):
        extra = {"arrival_index": i} if "arrival_index" in Request.__dataclass_fields__ else {}  # older trees
        req = Request(request_id=f"r{i}", prompt=None, prompt_token_ids=[1, 2, 3], params=params, seed=i, **extra)
        req.token_ids.append(4)
        req.num_computed_tokens = 3
        req.status = RequestStatus.RUNNING
        decodes.append(ScheduledRequest(req, 1, k))
    return StepBatch(decodes=decodes)


def make_proposals(logits: torch.Tensor, lens: list[int], with_probs: bool, g: torch.Generator) -> Proposals:
    """Proposals equal to the logits' argmax 70% of the time (so runs get accepted)."""
    n, k, vocab = len(lens), max(lens), logits.shape[1]
    argmax = logits.argmax(dim=-1).tolist()
    rows, row = [], 0
    for length in lens:
        ids = [argmax[row + j] if torch.rand(1, generator=g).item() < 0.7
               else int(torch.randint(vocab, (1,), generator=g)) for j in range(length)]
        rows.append(ids)
        row += length + 1
    if not with_probs:
        return Proposals.from_lists(rows)
    ids = torch.full((n, k), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    probs = torch.randn(n, k, vocab, generator=g).softmax(dim=-1)
    lens_t = torch.tensor(lens, dtype=torch.long)
    if hasattr(Proposals, "from_padded"):  # flat layout
        return Proposals.from_padded(ids, lens_t, probs)
    return Proposals(ids, lens_t, probs)


def run_case(name: str, n: int, k: int, vocab: int, reps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    ragged = name.startswith("ragged")
    lens = torch.randint(0, k + 1, (n,), generator=g).tolist() if ragged else [k] * n
    params = (SamplingParams(temperature=0.0) if name.endswith("greedy")
              else SamplingParams(temperature=0.8, top_p=0.95) if name.endswith("top_p")
              else SamplingParams(temperature=0.8))
    batch = make_batch(n, lens, params)
    logits = torch.randn(sum(lens) + n, vocab, generator=g) * 3
    proposals = make_proposals(logits, lens, name.endswith("draft_probs"), g)
    out = ForwardOutput(logits=logits, hidden_states=None)
    acceptance = RejectionSampler()
    scores = gather_scores(out, batch, proposals)
    gather_s = harness.time_calls(lambda: gather_scores(out, batch, proposals), reps)
    decide_s = harness.time_calls(lambda: decide(acceptance, batch, proposals, scores), reps)
    ms = lambda xs: round(1000 * statistics.median(xs), 3)  # noqa: E731
    return {"lens": lens, "logit_rows": len(lens) + sum(lens), "gather_scores_ms": ms(gather_s),
            "decide_ms": ms(decide_s), "total_ms": round(ms(gather_s) + ms(decide_s), 3),
            "decide_samples_ms": [round(1000 * x, 3) for x in decide_s]}


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "accept_layout.json", repeats=15,
                           quick="8 decodes, V = 4096, 3 calls per case")
    ap.add_argument("--label", required=True, help="key of this run in the JSON, e.g. before / after")
    ap.add_argument("--decodes", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--fresh", action="store_true", help="drop earlier runs of this label")
    args = ap.parse_args()
    if args.quick:
        args.decodes, args.vocab, args.repeats = 8, 4096, 3
    bench = harness.start("accept_layout", args)
    cases = ["greedy", "temperature", "temperature_draft_probs", "top_p", "ragged_greedy", "ragged_temperature",
             "ragged_top_p"]
    with torch.inference_mode():
        results = {c: run_case(c, args.decodes, args.k, args.vocab, args.repeats) for c in cases}
    # one file gathers the runs of every label: each run carries its own environment
    data = json.loads(args.out.read_text()) if args.out.is_file() else {"benchmark": bench.name}
    runs = data.setdefault("runs", {}).setdefault(args.label, [])
    if args.fresh:
        runs.clear()
    run = bench.result({"speculant_path": str(Path(speculant.__file__).parent), "decodes": args.decodes,
                        "k": args.k, "vocab": args.vocab, "reps": args.repeats, "cases": results})
    runs.append({k: v for k, v in run.items() if k != "benchmark"})
    # per label and case: the median over runs of each run's median (runs of labels are meant to alternate)
    data["summary_ms"] = {
        label: {case: {key: round(statistics.median(r["cases"][case][key] for r in label_runs), 3)
                       for key in ("gather_scores_ms", "decide_ms", "total_ms")}
                for case in label_runs[-1]["cases"]}
        for label, label_runs in data["runs"].items()}
    harness.write_json(args.out, data)
    for c, r in results.items():
        print(f"{args.label:>8} {c:<22} gather_scores {r['gather_scores_ms']:8.2f} ms  decide {r['decide_ms']:8.2f} ms")


if __name__ == "__main__":
    main()
