"""The name of one sequence's KV in a runner view, and the error for a name
the view does not hold (``views.RunnerView`` says how runners use them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False, slots=True)
class SequenceHandle:
    """Names one sequence's KV in one ``RunnerView``: what a ``QuerySpan``
    attends to. Opaque to plugins: the runner issues it (``open_sequence``,
    ``fork``; for a scorer, the step's ``ScheduledRequest.sequence``) and
    accepts only its own live handles, compared by identity, so a copy with
    the same fields is not the handle."""

    view: str
    """The issuing runner view (``RunnerView.name``)."""
    serial: int
    """This handle's number within its view."""
    label: str = ""
    """What its owner called it (a request id, say); shown in errors."""

    def __repr__(self) -> str:
        label = f" {self.label!r}" if self.label else ""
        return f"<sequence #{self.serial}{label} of runner view {self.view!r}>"


class SequenceHandleError(LookupError):
    """A span or call named a sequence handle its runner view does not hold
    (another view's, freed, expired or made up); nothing was read or written."""
