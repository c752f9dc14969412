"""Which forward path an engine's runners took (``model.fast_forward``), for tests
that must know: a supported architecture takes the fast decoder under "auto" and
"on", every other one runs transformers' modules."""

from __future__ import annotations

from speculant.model.fast_forward.plan import ARCH_SPECS


def runners(llm) -> list[tuple[str, object]]:
    """(name, runner) of the target and of every draft-model part of the proposer."""
    eng = llm.engine
    found = [("target", eng.runner)]
    proposer = eng.spec.proposer
    for part in getattr(proposer, "parts", [proposer]) if proposer is not None else []:
        runner = getattr(part, "runner", None)
        if runner is not None:
            found.append(("draft", runner))
    return found


def expect_fast_forward(llm) -> list[str]:
    """Assert each runner took the fast decoder exactly when its architecture has one and the
    setting allows it; returns the names of the runners on the fast path."""
    fast = []
    for name, runner in runners(llm):
        status = runner.fast_forward
        supported = runner.model.config.model_type in ARCH_SPECS
        want = supported and status.setting != "off"
        assert status.active == want, f"{name}: fast_forward {status.setting!r} -> {status.describe()}"
        if status.active:
            assert status.deviation == 0.0, f"{name}: the probe saw a deviation of {status.deviation}"
            fast.append(name)
    return fast
