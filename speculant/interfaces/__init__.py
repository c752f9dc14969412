"""The contract between the engine and its plugins, in one leaf package.

- ``data``: what flows through a step (``Proposals``, ``Scores``,
  ``AcceptedTokens``, ``QuerySpan``);
- ``components``: the ABCs of the four plugin kinds (``Proposer``,
  ``Scorer``, ``AcceptanceMethod``, ``AttentionBackend``) and the
  ``TargetView`` a proposer gets;
- ``capabilities``: the flags each kind declares, and ``NoOptions``;
- ``kinds``: the one table of plugin kinds (``PLUGIN_KINDS``).

Nothing here imports the rest of speculant (``tests/test_import_graph.py``):
core, the built-in plugins and third-party ones all depend on it. Plugin
packages import it through ``speculant.plugin_api``.

Only ``data`` needs torch; its names are imported on first use, so the plugin
layer and the command line load without torch.
"""

from typing import TYPE_CHECKING

from speculant.interfaces.capabilities import (
    AcceptanceCapabilities,
    AttentionBackendCapabilities,
    DraftProbsKind,
    NoOptions,
    ProposerCapabilities,
    ScorerCapabilities,
)
from speculant.interfaces.components import (
    AcceptanceMethod,
    AttentionBackend,
    Proposer,
    ProposerContext,
    Scorer,
    TargetView,
)
from speculant.interfaces.kinds import PLUGIN_KINDS, Kind, PluginKind, UnknownPluginError

if TYPE_CHECKING:
    from speculant.interfaces.data import PLACEHOLDER_TOKEN_ID, AcceptedTokens, Proposals, QuerySpan, Scores

__all__ = [
    "PLACEHOLDER_TOKEN_ID", "PLUGIN_KINDS", "AcceptanceCapabilities", "AcceptanceMethod", "AcceptedTokens",
    "AttentionBackend", "AttentionBackendCapabilities", "DraftProbsKind", "Kind", "NoOptions", "PluginKind",
    "Proposals", "Proposer", "ProposerCapabilities", "ProposerContext", "QuerySpan", "Scorer", "ScorerCapabilities",
    "Scores", "TargetView", "UnknownPluginError",
]
_DATA = ("PLACEHOLDER_TOKEN_ID", "AcceptedTokens", "Proposals", "QuerySpan", "Scores")


def __getattr__(name: str) -> object:
    if name in _DATA:
        from speculant.interfaces import data

        return getattr(data, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
