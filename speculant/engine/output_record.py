"""What a finished request reports to the outside, built once for every front end (server and batch).

``OutputRecord.of(out)`` reads a finished ``RequestOutput``: its text, finish
reason, error, token usage and speculation summary. The server's responses put
``usage`` and ``speculant`` beside OpenAI's fields; a batch job's output line is
``{"id", **record.fields()}``. A field added here (a per-request figure) reaches
both, from ``summary()``.

The speculation summary, ``speculant``: ``spec_steps`` (verify steps in which the
request speculated), ``draft_tokens``, ``accepted_tokens``, ``acceptance_rate``
(accepted / drafted), ``mean_acceptance_length`` (tokens emitted per verify step,
bonus token included), ``acceptance_per_position`` (the rate at draft position 1,
2, ...) and ``preemptions``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speculant.engine.request import RequestOutput


def spec_summary(out: RequestOutput) -> dict[str, Any]:
    m = out.metrics or {}
    return {"spec_steps": m.get("num_steps", 0), "draft_tokens": m.get("num_draft_tokens", 0),
            "accepted_tokens": m.get("num_accepted_tokens", 0),
            "acceptance_rate": round(m.get("acceptance_rate", 0.0), 6),
            "mean_acceptance_length": round(m.get("mean_accepted_length", 0.0), 6),
            "acceptance_per_position": [round(x, 6) for x in m.get("acceptance_per_position", [])],
            "accepted_length_histogram": list(m.get("accepted_length_histogram", [])),
            "spec_off_steps": m.get("num_off_steps", 0),
            "propose_s": round(m.get("propose_s", 0.0), 6),
            "preemptions": m.get("num_preemptions", 0)}


def usage(out: RequestOutput) -> dict[str, int]:
    prompt, completion = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass(frozen=True, slots=True)
class OutputRecord:
    text: str
    finish_reason: str | None
    error: str | None
    """Set when the engine failed the request (finish_reason "error")."""
    usage: dict[str, int]
    speculant: dict[str, Any]

    @classmethod
    def of(cls, out: RequestOutput) -> OutputRecord:
        c = out.outputs[0]
        error = None
        if c.finish_reason == "error":
            error = c.error or out.error or f"the engine failed request {out.request_id!r}"
        return cls(c.text, c.finish_reason, error, usage(out), spec_summary(out))

    def summary(self) -> dict[str, Any]:
        """The fields every front end adds to its own answer: usage and the speculation summary."""
        return {"usage": self.usage, "speculant": self.speculant}

    def fields(self) -> dict[str, Any]:
        """The whole record as JSON fields (a batch output line, without its id)."""
        if self.error is not None:
            return {"error": self.error}
        return {"text": self.text, "finish_reason": self.finish_reason, **self.summary()}
