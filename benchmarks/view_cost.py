"""What the plugin contract's read-only views cost per engine step (#48).

Since plugin API 2.0 the engine hands proposers and scorers a ``StepBatch``
view (frozen entries, a live ``RequestView`` per request) instead of its own
objects. Per step that is one ``batch.view()`` (built once, shared by propose,
score and commit), and every token-id read goes through ``TokenIds``.

Configurations, interleaved over ``--repeats`` rounds, each timing
``--calls`` calls: ``view`` builds the view of a step of ``--batch`` decodes
(a fresh engine batch each call, as the scheduler makes one per step);
``ngram_engine_objects`` runs the n-gram proposer on the engine's own batch
(what 1.x plugins got) and ``ngram_view`` on the view (what they get now), on
sequences of ``--tokens`` tokens. Reported: median microseconds per call and
the spread (min, max) over rounds.

    flock /tmp/bench.lock python benchmarks/view_cost.py --batch 32 --tokens 512
"""

from __future__ import annotations

import time

import harness


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "view_cost.json", repeats=7, threads=1)
    ap.add_argument("--batch", type=int, default=32, help="decodes per step")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per sequence")
    ap.add_argument("--calls", type=int, default=200, help="calls timed per configuration and round")
    args = ap.parse_args()
    bench = harness.start("view_cost", args)
    import torch

    from speculant.engine.batch import ScheduledRequest, StepBatch
    from speculant.engine.request import Request
    from speculant.interfaces import SamplingParams
    from speculant.proposers.ngram import NgramOptions, NgramProposer

    gen = torch.Generator().manual_seed(0)
    requests = []
    for i in range(args.batch):
        ids = torch.randint(2, 300, (args.tokens,), generator=gen).tolist()
        req = Request(f"r{i}", None, ids[: args.tokens // 2], SamplingParams(temperature=0.0), seed=0, token_ids=ids)
        req.num_computed_tokens = args.tokens - 1
        requests.append(req)

    def engine_batch() -> StepBatch:
        return StepBatch(decodes=[ScheduledRequest(r, 1, 4, [0, 1, 2]) for r in requests])

    from types import SimpleNamespace

    context = SimpleNamespace(target=SimpleNamespace(device=torch.device("cpu")))  # all the n-gram proposer reads
    proposer = NgramProposer(NgramOptions(), context)  # type: ignore[arg-type]
    fixed = engine_batch()
    fixed_view = fixed.view()
    work = {
        "view": lambda: engine_batch().view(),
        "ngram_engine_objects": lambda: proposer.propose(fixed),  # type: ignore[arg-type]
        "ngram_view": lambda: proposer.propose(fixed_view),
    }

    def run_one(name: str) -> dict[str, float]:
        fn = work[name]
        fn()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        return {"us_per_call": (time.perf_counter() - t0) / args.calls * 1e6}

    runs = harness.rounds(list(work), args.repeats, run_one, lambda r: f"{r['us_per_call']:.1f} us")
    summary = {}
    for name, rs in runs.items():
        values = [r["us_per_call"] for r in rs]
        summary[name] = {"median_us": round(harness.median(values), 2), "min_us": round(min(values), 2),
                         "max_us": round(max(values), 2)}
    print(harness.markdown_table(["configuration", "median us/call", "min", "max"],
                                 [[n, s["median_us"], s["min_us"], s["max_us"]] for n, s in summary.items()]))
    bench.write({"summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
