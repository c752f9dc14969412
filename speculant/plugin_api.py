"""Everything a plugin package needs, from one import path.

    from speculant.plugin_api import Proposals, Proposer, ProposerCapabilities, hookimpl

The contract itself lives in ``speculant.interfaces``; this module gathers
it with the types a plugin's methods receive (``StepBatch`` and its
``ScheduledRequest`` entries, the ``EngineConfig`` of ``validate_against``) and
the ``hookimpl`` marker that registers its classes.
"""

from speculant.config.models import EngineConfig
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.request import Request
from speculant.interfaces import (
    PLACEHOLDER_TOKEN_ID,
    AcceptanceCapabilities,
    AcceptanceMethod,
    AcceptedTokens,
    AttentionBackend,
    AttentionBackendCapabilities,
    NoOptions,
    Proposals,
    Proposer,
    ProposerCapabilities,
    ProposerContext,
    QuerySpan,
    Scorer,
    ScorerCapabilities,
    Scores,
    TargetView,
)
from speculant.plugins.hookspecs import hookimpl

__all__ = [
    "PLACEHOLDER_TOKEN_ID", "AcceptanceCapabilities", "AcceptanceMethod", "AcceptedTokens", "AttentionBackend",
    "AttentionBackendCapabilities", "EngineConfig", "NoOptions", "Proposals", "Proposer", "ProposerCapabilities",
    "ProposerContext", "QuerySpan", "Request", "ScheduledRequest", "Scorer", "ScorerCapabilities", "Scores",
    "StepBatch", "TargetView", "hookimpl",
]
