"""The conformance checks of a proposer.

1. Greedy output equals the engine's without speculation, token for token,
   under every schedule (whole prompts, chunked prefill, preemption) and
   when another request is aborted mid-way.
2. Sampled output follows the target's distribution: with lossless
   acceptance, the tokens drawn under speculation pass a chi-square test
   against the exact marginal (``stats``), on a 16-token model.
3. A fault costs only speculation: the same class, made to raise in
   ``propose`` and ``commit`` now and then, still gives the exact output.
4. Bookkeeping: ``commit`` gets the batch ``propose`` got, one entry per
   decode within what was proposed; every request the proposer saw is
   ``free``d by the end, and its ``proposer_state`` is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speculant.interfaces import Proposer
from speculant.plugin_api.testing.runs import (
    GREEDY,
    SCHEDULES,
    ConformanceError,
    check_same,
    check_sampled,
    engine,
    prompts,
    registered,
    run_with_abort,
    token_ids,
)
from speculant.plugin_api.testing.tiny_model import VOCAB_SIZE, TinyModels

PROMPT_LENGTHS = (5, 11, 17, 23, 9, 30)

Options = dict[str, Any] | Callable[[TinyModels], dict[str, Any]] | None


@dataclass
class ProposerReport:
    """What the checks saw (for the plugin author's own assertions)."""

    schedules: list[str] = field(default_factory=list)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    proposer_errors: int = 0
    faults_survived: int = 0  # injected faults the engine caught while the output stayed exact
    p_values: list[float] = field(default_factory=list)
    total_variations: list[float] = field(default_factory=list)


def resolve_options(options: Options, models: TinyModels) -> dict[str, Any]:
    if options is None:
        return {}
    return options(models) if callable(options) else dict(options)


def _spec(name: str, options: dict[str, Any], k: int, **more: Any) -> dict[str, Any]:
    return {"proposer": name, "proposer_options": options, "num_speculative_tokens": k, **more}


def check_greedy(proposer: type[Proposer], models: TinyModels, options: Options = None, k: int = 3,
                 report: ProposerReport | None = None) -> ProposerReport:
    report = report or ProposerReport()
    chunking = proposer.capabilities.supports_chunked_prefill
    texts = prompts(PROMPT_LENGTHS, VOCAB_SIZE)
    with registered("proposer", proposer) as name:
        opts = resolve_options(options, models)
        for schedule in SCHEDULES:
            if schedule.chunked and not chunking:
                continue
            settings = schedule.settings if chunking else {**schedule.settings, "enable_chunked_prefill": False}
            want = token_ids(engine(models.text, None, settings), texts, GREEDY)
            llm = engine(models.text, _spec(name, opts, k), settings)
            check_same(token_ids(llm, texts, GREEDY), want,
                       f"greedy output under speculation differs from the engine without it ({schedule.name})")
            metrics = llm.get_metrics()
            report.schedules.append(schedule.name)
            report.num_draft_tokens += int(metrics.get("num_draft_tokens", 0))
            report.num_accepted_tokens += int(metrics.get("num_accepted_tokens", 0))
            report.proposer_errors += int(metrics.get("proposer_errors", 0))
        settings = {**SCHEDULES[0].settings}
        want = token_ids(engine(models.text, None, settings), texts, GREEDY)
        got_left = run_with_abort(engine(models.text, _spec(name, opts, k), settings), texts, GREEDY,
                                  abort_index=1, after_outputs=3)
        check_same(got_left, want, "greedy output differs after another request was aborted")
        report.schedules.append("abort")
    if report.proposer_errors:
        raise ConformanceError(f"the proposer faulted {report.proposer_errors} time(s) in plain runs (the engine "
                               "logged each fault with its cause): it raised or returned invalid Proposals")
    return report


def check_sampling(proposer: type[Proposer], models: TinyModels, options: Options = None, k: int = 2,
                   report: ProposerReport | None = None) -> ProposerReport:
    """With lossless (rejection) acceptance, sampled output follows the target's distribution."""
    report = report or ProposerReport()
    with registered("proposer", proposer) as name:
        spec = _spec(name, resolve_options(options, models), k, acceptance="rejection")
        report.p_values, report.total_variations = check_sampled(spec, models, f"proposer {name!r}")
    return report


def faulty_subclass(proposer: type[Proposer]) -> type[Proposer]:
    """``proposer`` that raises in every third ``propose`` and every fifth ``commit``."""
    calls = {"propose": 0, "commit": 0}

    def propose(self: Any, batch: Any) -> Any:
        calls["propose"] += 1
        if calls["propose"] % 3 == 0:
            raise RuntimeError("conformance kit: injected propose fault")
        return proposer.propose(self, batch)

    def commit(self: Any, batch: Any, num_accepted: Any, scores: Any) -> None:
        calls["commit"] += 1
        if calls["commit"] % 5 == 0:
            raise RuntimeError("conformance kit: injected commit fault")
        proposer.commit(self, batch, num_accepted, scores)

    return type(f"Faulty{proposer.__name__}", (proposer,), {
        "name": f"{proposer.name}-kit-faulty", "propose": propose, "commit": commit,
        "__module__": proposer.__module__})


def check_faults(proposer: type[Proposer], models: TinyModels, options: Options = None, k: int = 3) -> int:
    """Exact output while the proposer faults; returns how many faults the engine counted."""
    faulty = faulty_subclass(proposer)
    texts = prompts(PROMPT_LENGTHS, VOCAB_SIZE)
    settings = {**SCHEDULES[0].settings}
    want = token_ids(engine(models.text, None, settings), texts, GREEDY)
    with registered("proposer", faulty) as name:
        llm = engine(models.text, _spec(name, resolve_options(options, models), k), settings)
        got = token_ids(llm, texts, GREEDY)
    check_same(got, want, "a faulting proposer changed the output (a fault must cost only speculation: the "
               "proposer must rebuild its state after free)")
    errors = int(llm.get_metrics()["proposer_errors"])
    if errors == 0:
        raise ConformanceError("the injected faults were never reached: the proposer was not called")
    return errors
