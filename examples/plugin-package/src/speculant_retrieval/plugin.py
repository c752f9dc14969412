"""The module named by this distribution's ``speculant.plugins`` entry point."""

from __future__ import annotations

from speculant.plugin_api import hookimpl
from speculant_retrieval.proposer import RetrievalProposer


@hookimpl
def register_proposers(register):
    register(RetrievalProposer)
