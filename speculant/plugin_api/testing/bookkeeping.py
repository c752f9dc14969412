"""The proposer's side of the step protocol, checked while the engine runs.

A recording subclass of the proposer under test wraps ``propose``,
``commit`` and ``free`` and checks, call by call, what the contract
promises and asks:

- ``propose`` returns at most each decode's ``num_spec_tokens``, one row per
  decode;
- ``commit`` follows the ``propose`` of the same step, with the same batch
  object and one accepted count per decode, each within what that decode
  was proposed, its ``nodes`` the chain ``0 .. count - 1``;
- ``free`` may be called again for a request the proposer already
  dropped, and must not raise;
- the proposer never faults (the engine counts ``proposer_errors``), and by
  the time the engine is idle every request it saw was ``free``d after it
  last saw it, its ``proposer_state`` empty.
"""

from __future__ import annotations

from typing import Any

from speculant.interfaces import Proposer, SamplingParams
from speculant.plugin_api.testing.runs import SCHEDULES, ConformanceError, engine, prompts, registered, token_ids
from speculant.plugin_api.testing.tiny_model import VOCAB_SIZE, TinyModels


class Ledger:
    def __init__(self) -> None:
        self.pending: tuple[Any, list[int]] | None = None  # the step's batch and proposal lens
        self.seen: dict[str, Any] = {}  # request id -> its view
        self.live: set[str] = set()  # seen since their last free
        self.problems: list[str] = []
        self.num_commits = 0

    def proposed(self, batch: Any, lens: list[int]) -> None:
        if len(lens) != len(batch.decodes):
            self.problems.append(f"propose returned {len(lens)} rows for {len(batch.decodes)} decodes")
        for d, n in zip(batch.decodes, lens):
            if n > d.num_spec_tokens:
                self.problems.append(f"propose gave request {d.request_id!r} {n} tokens over its budget "
                                     f"num_spec_tokens = {d.num_spec_tokens}")
        for e in batch.entries:
            self.seen[e.request_id] = e.request
            self.live.add(e.request_id)
        self.pending = (batch, lens)

    def committed(self, batch: Any, accepted: Any) -> None:
        self.num_commits += 1
        pending, self.pending = self.pending, None
        if pending is None or pending[0] is not batch:
            self.problems.append("commit received a batch other than the one propose got this step")
            return
        lens = pending[1]
        if len(accepted) != len(batch.decodes):
            self.problems.append(f"commit got {len(accepted)} accepted counts for {len(batch.decodes)} decodes")
        for d, a, n, nodes in zip(batch.decodes, accepted, lens, accepted.nodes):
            if not 0 <= a <= n or nodes != list(range(a)):
                self.problems.append(f"commit got {a} accepted (nodes {nodes}) for request {d.request_id!r} "
                                     f"which was proposed {n}")

    def freed(self, request_id: str) -> None:
        self.live.discard(request_id)
        self.pending = None  # a fault or a failed step: no commit follows this step's propose


def recording_subclass(proposer: type[Proposer], ledger: Ledger) -> type[Proposer]:
    def propose(self: Any, batch: Any) -> Any:
        out = proposer.propose(self, batch)
        ledger.proposed(batch, out.lens.tolist())
        return out

    def commit(self: Any, batch: Any, num_accepted: Any, scores: Any) -> None:
        ledger.committed(batch, num_accepted)
        proposer.commit(self, batch, num_accepted, scores)

    def free(self: Any, request_id: str) -> None:
        proposer.free(self, request_id)
        try:  # free may come for a request the proposer holds nothing for (after a reset, say)
            proposer.free(self, request_id)
        except Exception as exc:  # noqa: BLE001 - a plugin may raise anything
            ledger.problems.append(f"a second free({request_id!r}) raised {type(exc).__name__}: {exc}")
        ledger.freed(request_id)

    return type(f"Recorded{proposer.__name__}", (proposer,), {
        "name": f"{proposer.name}-kit-recorded", "propose": propose, "commit": commit, "free": free,
        "__module__": proposer.__module__})


def check_bookkeeping(proposer: type[Proposer], models: TinyModels, options: dict[str, Any], k: int = 3) -> Ledger:
    ledger = Ledger()
    recorded = recording_subclass(proposer, ledger)
    texts = prompts((5, 11, 17, 23, 9, 30), VOCAB_SIZE, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    schedule = next(s for s in SCHEDULES if s.name == "preemption")
    settings = {**schedule.settings}
    with registered("proposer", recorded) as name:
        llm = engine(models.text, {"proposer": name, "proposer_options": options, "num_speculative_tokens": k},
                     settings)
        token_ids(llm, texts, params)
    if llm.get_metrics()["proposer_errors"]:
        ledger.problems.append(f"the proposer faulted {llm.get_metrics()['proposer_errors']} time(s) (the engine "
                               "logged each with its cause)")
    if ledger.live:
        ledger.problems.append(f"requests {sorted(ledger.live)} finished but the proposer was not freed for them "
                               "after it last saw them")
    kept = sorted(rid for rid, view in ledger.seen.items() if view.proposer_state)
    if kept:
        ledger.problems.append(f"proposer_state of finished requests {kept} is not empty")
    if ledger.num_commits == 0:
        ledger.problems.append("commit was never called")
    if ledger.problems:
        raise ConformanceError("proposer bookkeeping: " + "; ".join(ledger.problems[:5]))
    return ledger
