"""Call the configured proposer so that its faults stay with it.

A proposer only makes a step faster; it never decides what a request emits
(acceptance verifies every proposal against the target). So a proposer fault
never fails a request: when ``propose`` raises or returns output that
``proposal_checks`` rejects, the affected decodes run this step without
speculation, the proposer's state for those requests is reset (``free``; it
rebuilds from ``request.token_ids`` when it next sees them, as after a
preemption), a warning names the plugin and the fault, and
``proposer_errors`` counts it in ``get_metrics``. A ``commit`` that raises
resets the state of the whole step's requests the same way. A ``propose``
slower than ``SLOW_PROPOSER_SECONDS`` stalls every request of the engine: it
is counted (``slow_proposer_calls``) and warned about once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from speculant.engine.proposal_checks import check_proposals
from speculant.interfaces import Proposals, Proposer
from speculant.interfaces.tree import tree_settings

if TYPE_CHECKING:
    from speculant.interfaces import AcceptedNodes, Scores
    from speculant.interfaces.batch import RequestView, StepBatch

logger = logging.getLogger(__name__)

SLOW_PROPOSER_SECONDS = 1.0


def plugin_name(proposer: Proposer) -> str:
    return getattr(proposer, "name", None) or type(proposer).__name__


def tree_width(proposer: Proposer) -> int:
    """The most children per tree node the engine takes from ``proposer`` (1: chains only):
    ``speculative.tree_width`` where the proposer declares ``proposes_trees``."""
    return tree_settings(proposer.context)[0] if proposer.capabilities.proposes_trees else 1


class ProposerGuard:
    """Counters and fault handling around one engine's proposer (passed to
    each call, so a proposer swapped in later is guarded too)."""

    def __init__(self, vocab_size: int, slow_seconds: float = SLOW_PROPOSER_SECONDS,
                 views: Callable[[str], RequestView | None] = lambda request_id: None) -> None:
        self.vocab_size = vocab_size
        self.views = views  # request id -> its view, whose proposer_state ``free`` empties
        self.slow_seconds = slow_seconds
        self.errors = 0
        self.slow_calls = 0
        self._warned_slow = False

    def propose(self, proposer: Proposer, batch: StepBatch) -> Proposals:
        """Checked proposals, one row per decode, on the target's device; never raises."""
        n = len(batch.decodes)
        device = proposer.context.target.device
        start = time.perf_counter()
        try:
            out = proposer.propose(batch)
        except Exception as exc:  # noqa: BLE001 - a plugin may raise anything
            self._fault(proposer, f"propose raised {type(exc).__name__}: {exc}",
                        [e.request.request_id for e in batch.entries], exc)
            return Proposals.empty(n, device)
        finally:
            self._check_time(proposer, time.perf_counter() - start, batch)
        checked = check_proposals(out, batch, self.vocab_size, device, tree_width(proposer))
        if checked.problems:
            rows = range(n) if checked.structural else checked.bad_rows
            ids = [batch.decodes[i].request.request_id for i in rows]
            if checked.structural:  # no row can be trusted: the prefills' state may be off too
                ids = [e.request.request_id for e in batch.entries]
            self._fault(proposer, "returned invalid proposals: " + "; ".join(checked.problems), ids)
        return checked.proposals

    def commit(self, proposer: Proposer, batch: StepBatch, num_accepted: AcceptedNodes, scores: Scores) -> None:
        try:
            proposer.commit(batch, num_accepted, scores)
        except Exception as exc:  # noqa: BLE001
            self._fault(proposer, f"commit raised {type(exc).__name__}: {exc}",
                        [e.request.request_id for e in batch.entries], exc)

    def restore_prefix(self, proposer: Proposer, request: RequestView, num_cached_tokens: int) -> int:
        """Leading tokens of ``request`` the target may skip; 0 (nothing skipped,
        the proposer's state for it reset) if the proposer raises or answers
        something other than an int in [0, num_cached_tokens]."""
        try:
            kept = proposer.restore_prefix(request, num_cached_tokens)
        except Exception as exc:  # noqa: BLE001 - a plugin may raise anything
            self._fault(proposer, f"restore_prefix raised {type(exc).__name__}: {exc}", [request.request_id], exc)
            return 0
        if isinstance(kept, bool) or not isinstance(kept, int) or not 0 <= kept <= num_cached_tokens:
            self._fault(proposer, f"restore_prefix returned {kept!r}, not an int in [0, {num_cached_tokens}]",
                        [request.request_id])
            return 0
        return kept

    def free(self, proposer: Proposer, request_id: str) -> None:
        view = self.views(request_id)
        if view is not None:
            view.proposer_state.clear()
        try:
            proposer.free(request_id)
        except Exception as exc:
            self.errors += 1
            logger.warning("proposer %r: free(%r) raised %s: %s; its state for that request may be stale "
                           "(the request's output is unaffected: every proposal is verified)",
                           plugin_name(proposer), request_id, type(exc).__name__, exc,
                           exc_info=(type(exc), exc, exc.__traceback__))

    def reset(self, proposer: Proposer, request_ids: list[str]) -> None:
        """Drop the proposer's state for these requests; it rebuilds it later."""
        for rid in request_ids:
            self.free(proposer, rid)

    def _fault(self, proposer: Proposer, what: str, request_ids: list[str],
               exc: BaseException | None = None) -> None:
        self.errors += 1
        shown = ", ".join(repr(r) for r in request_ids[:8]) + (" ..." if len(request_ids) > 8 else "")
        logger.warning(
            "proposer %r %s; requests [%s] continue without speculation this step and the proposer's "
            "state for them is reset (outputs are unaffected; fix or replace the plugin, or set "
            "speculative.proposer to another one)", plugin_name(proposer), what, shown,
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None)
        self.reset(proposer, request_ids)

    def _check_time(self, proposer: Proposer, seconds: float, batch: StepBatch) -> None:
        if seconds <= self.slow_seconds:
            return
        self.slow_calls += 1
        if not self._warned_slow:
            self._warned_slow = True
            logger.warning(
                "proposer %r took %.2f s for one step (%d prefill chunks, %d decodes), over the %.2f s "
                "threshold: every request of the engine waits for it. Lower "
                "speculative.num_speculative_tokens, use a smaller draft, or set "
                "speculative.disable_by_batch_size; slow_proposer_calls in get_metrics() counts these "
                "(warned once)", plugin_name(proposer), seconds, len(batch.prefills), len(batch.decodes),
                self.slow_seconds)
