"""The four plugin kinds, in one table.

Each kind names its ABC, its capability flags, the pluggy hook plugins
register it through, the setting that selects one and how messages name it.
The registry, the hook checks, the config checker and the CLI read this table
and nothing else. A lookup of a name no plugin registered raises
``UnknownPluginError``, which lists what is available.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

from speculant.interfaces.capabilities import (
    AcceptanceCapabilities,
    AttentionBackendCapabilities,
    ProposerCapabilities,
    ScorerCapabilities,
)
from speculant.interfaces.components import AcceptanceMethod, AttentionBackend, Proposer, Scorer

Kind = Literal["proposer", "scorer", "acceptance", "attention_backend"]


@dataclass(frozen=True)
class PluginKind:
    kind: Kind
    label: str
    """How messages name it (``no acceptance method named 'x'``)."""
    hook: str
    """The hook (``speculant.plugins.hookspecs``) a plugin registers its classes through."""
    setting: str
    """The config key whose value names one."""
    base: type
    """The ABC every class of this kind derives from."""
    capabilities: type
    """The frozen dataclass its ``capabilities`` class attribute is an instance of."""


PLUGIN_KINDS: dict[Kind, PluginKind] = {k.kind: k for k in (
    PluginKind("proposer", "proposer", "register_proposers", "speculative.proposer",
               Proposer, ProposerCapabilities),
    PluginKind("scorer", "scorer", "register_scorers", "speculative.scorer",
               Scorer, ScorerCapabilities),
    PluginKind("acceptance", "acceptance method", "register_acceptance_methods", "speculative.acceptance",
               AcceptanceMethod, AcceptanceCapabilities),
    PluginKind("attention_backend", "attention backend", "register_attention_backends", "model.attention_backend",
               AttentionBackend, AttentionBackendCapabilities),
)}


class UnknownPluginError(KeyError):
    """A name that no loaded plugin registered for that kind."""

    def __init__(self, kind: Kind, name: str, available: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.available = available
        label = PLUGIN_KINDS[kind].label
        listed = ", ".join(available) if available else "none (no plugin registered one; see `speculant plugins`)"
        close = difflib.get_close_matches(name, available, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        self.message = f"no {label} named {name!r}; available: {listed}{hint}"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message
