"""The conformance kit: run it from your plugin package's own tests.

    from speculant.plugin_api import testing

    def test_my_proposer_conforms(tmp_path_factory):
        models = testing.TinyModels.build(tmp_path_factory.mktemp("kit"))
        report = testing.check_proposer(MyProposer, models, options={"window": 64})
        assert report.num_draft_tokens > 0  # it did propose something

Each check builds engines on tiny random models the kit writes itself
(``TinyModels``: nothing is downloaded), registers the class under test as a
plugin for the time of the check, and raises ``ConformanceError`` (an
``AssertionError``) naming what failed, the schedule and the request:

- ``check_proposer``: greedy output equal to the engine's without speculation
  across schedules (whole prompts, chunked prefill, preemption, an abort),
  sampled output following the target's distribution (chi-square against
  the exact marginal), fault isolation, and ``propose``/``commit``/``free``
  bookkeeping (``proposer_checks``, ``bookkeeping``);
- ``check_scorer`` and ``check_acceptance``: the same equalities with the
  component in the engine, and acceptance's greedy semantics on made-up
  logits (``component_checks``).

``options`` is the plugin's options mapping, or a function of the
``TinyModels`` that returns it (for a plugin that needs a model path).
The checks take a few minutes on two CPU cores.
"""

from __future__ import annotations

from typing import Any

from speculant.interfaces import Proposer
from speculant.plugin_api.testing.bookkeeping import check_bookkeeping
from speculant.plugin_api.testing.component_checks import check_accept_unit, check_acceptance, check_scorer
from speculant.plugin_api.testing.proposer_checks import (
    Options,
    ProposerReport,
    check_faults,
    check_greedy,
    check_sampling,
    resolve_options,
)
from speculant.plugin_api.testing.runs import ConformanceError
from speculant.plugin_api.testing.tiny_model import TinyModels

__all__ = [
    "ConformanceError", "ProposerReport", "TinyModels", "check_accept_unit", "check_acceptance",
    "check_bookkeeping", "check_faults", "check_greedy", "check_proposer", "check_sampling", "check_scorer",
]


def check_proposer(proposer: type[Proposer], models: TinyModels, options: Options = None, *,
                   sampling: bool = True) -> ProposerReport:
    """Every proposer check; ``sampling=False`` skips the statistical one (for
    a proposer that cannot run on the 16-token model, e.g. one with its own
    model of another vocabulary)."""
    report = check_greedy(proposer, models, options)
    report.faults_survived = check_faults(proposer, models, options)
    opts: Any = resolve_options(options, models)
    check_bookkeeping(proposer, models, opts)
    if sampling:
        check_sampling(proposer, models, options, report=report)
    return report
