"""The contract between the engine and its plugins, in one leaf package.

- ``data``: what flows through a step (``Proposals``, ``Scores``,
  ``AcceptedTokens``, ``QuerySpan``);
- ``components``: the ABCs of the four plugin kinds (``Proposer``,
  ``Scorer``, ``AcceptanceMethod``, ``AttentionBackend``) and the
  ``TargetView`` a proposer gets;
- ``capabilities``: the flags each kind declares, and ``NoOptions``;
- ``kinds``: the one table of plugin kinds (``PLUGIN_KINDS``);
- ``batch``: the read-only views of a step's batch a plugin receives
  (``StepBatch``, ``ScheduledRequest``, ``RequestView``, ``TokenIds``);
- ``sampling_params``: each request's ``SamplingParams``;
- ``views``: the protocols of what a plugin calls or reads (``RunnerView``,
  ``EngineConfigView``);
- ``sequence``: the ``SequenceHandle`` naming a sequence's KV in a runner view;
- ``layout``: how a step's batch becomes query spans and its logits ``Scores``;
- ``version``: ``API_VERSION``, the contract's version a plugin declares.

Nothing here imports the rest of speculant (``tests/test_import_graph.py``):
core, the built-in plugins and third-party ones all depend on it. Plugin
packages import it through ``speculant.plugin_api``.

Only ``data`` needs torch; its names are imported on first use, so the plugin
layer and the command line load without torch.
"""

from typing import TYPE_CHECKING

from speculant.interfaces.batch import RequestView, ScheduledRequest, StepBatch, TokenIds
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
from speculant.interfaces.sampling_params import SamplingParams
from speculant.interfaces.sequence import SequenceHandle, SequenceHandleError
from speculant.interfaces.version import API_VERSION, PluginVersionError, version_problem
from speculant.interfaces.views import EngineConfigView, ForwardResult, RunnerView

if TYPE_CHECKING:
    from speculant.interfaces.data import (
        PLACEHOLDER_TOKEN_ID,
        AcceptedNodes,
        AcceptedTokens,
        Proposals,
        QuerySpan,
        Scores,
    )
    from speculant.interfaces.layout import decode_tokens, gather_scores, prefill_spans, score_flat

__all__ = [
    "API_VERSION", "PLACEHOLDER_TOKEN_ID", "PLUGIN_KINDS", "AcceptanceCapabilities", "AcceptanceMethod",
    "AcceptedNodes", "AcceptedTokens", "AttentionBackend", "AttentionBackendCapabilities", "DraftProbsKind",
    "EngineConfigView",
    "ForwardResult", "Kind", "NoOptions", "PluginKind", "PluginVersionError", "Proposals", "Proposer",
    "ProposerCapabilities", "ProposerContext", "QuerySpan", "RequestView", "RunnerView", "SamplingParams",
    "ScheduledRequest", "Scorer", "ScorerCapabilities", "Scores", "SequenceHandle",
    "SequenceHandleError", "StepBatch", "TargetView", "TokenIds",
    "UnknownPluginError", "decode_tokens", "gather_scores", "prefill_spans", "score_flat", "version_problem",
]
_LAZY = {"data": ("PLACEHOLDER_TOKEN_ID", "AcceptedNodes", "AcceptedTokens", "Proposals", "QuerySpan", "Scores"),
         "layout": ("decode_tokens", "gather_scores", "prefill_spans", "score_flat")}


def __getattr__(name: str) -> object:
    for module, names in _LAZY.items():
        if name in names:
            import importlib

            return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
