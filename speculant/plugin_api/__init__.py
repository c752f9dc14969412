"""Everything a plugin package needs, from one import path.

    from speculant.plugin_api import API_VERSION, Proposals, Proposer, StepBatch, hookimpl

This module re-exports the contract, ``speculant.interfaces``, and nothing
else of speculant: the ``hookimpl`` marker that registers a plugin's classes
and ``API_VERSION``, the version each plugin class declares it targets
(``api_version = "3.0"``). ``speculant.plugin_api.testing`` is the
conformance kit a plugin package runs from its own tests.
"""

from speculant.interfaces import *  # noqa: F403 - the contract, whole
from speculant.interfaces import __all__ as _contract
from speculant.plugins.hookspecs import hookimpl

__all__ = [*_contract, "hookimpl"]
