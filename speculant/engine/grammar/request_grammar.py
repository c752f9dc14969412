"""One request's grammar state: a matcher that follows its committed tokens.

The matcher's state is a function of the request's committed output alone:
before each step ``sync`` consumes the output tokens committed since the last
step (and rolls back anything it holds beyond them), so nothing has to be
undone when a step's proposals are rejected, the step fails, the request is
preempted (its output stays; only its K/V is recomputed) or aborted (the
state goes with the request). Proposals are only ever consumed tentatively,
inside llguidance's draft-token mask call, which rolls them back itself.

A matcher error (a committed token the grammar refuses, or llguidance giving
up on the grammar) raises ``GrammarFault``: that request fails alone.
"""

from __future__ import annotations

from typing import Any

from speculant.config.structured import StructuredOutput


class GrammarFault(RuntimeError):
    """The request's grammar state is broken; the request fails, no other."""


class RequestGrammar:
    """The matcher of one request and the output tokens it has consumed."""

    def __init__(self, spec: StructuredOutput, matcher: Any) -> None:
        self.spec = spec
        self.matcher = matcher  # llguidance.LLMatcher
        self.tokens: list[int] = []  # output tokens consumed (the committed ones at the last sync)

    def sync(self, output_token_ids: list[int]) -> None:
        """Make the matcher hold exactly ``output_token_ids`` (committed output)."""
        if self.matcher.is_error():
            self._fault(f"following its {len(self.tokens)} committed tokens")
        n = len(self.tokens)
        if n > len(output_token_ids) or (n and output_token_ids[n - 1] != self.tokens[-1]):
            common = 0
            while common < min(n, len(output_token_ids)) and self.tokens[common] == output_token_ids[common]:
                common += 1
            if not self.matcher.rollback(n - common):
                self._fault(f"rolling back {n - common} tokens")
            del self.tokens[common:]
        new = output_token_ids[len(self.tokens):]
        if new:
            if not self.matcher.consume_tokens(new):
                self._fault(f"consuming committed tokens {new}")
            self.tokens.extend(new)

    def valid_prefix(self, proposal: list[int]) -> int:
        """How many leading tokens of ``proposal`` the grammar allows from the committed state."""
        if not proposal:
            return 0
        return int(self.matcher.validate_tokens(proposal))

    def check(self) -> None:
        if self.matcher.is_error():
            self._fault("computing its token masks")

    def _fault(self, doing: str) -> None:
        raise GrammarFault(f"its {self.spec.kind} grammar failed while {doing}: "
                           f"{self.matcher.get_error() or 'the matcher refused the tokens'}")
