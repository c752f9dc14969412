"""Resolve the configured plugins (attention backend, proposer, scorer,
acceptance method) from the registry and build them.

Core never names a concrete proposer or scorer: names come from the config
and classes from the plugin registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from speculant.core.acceptance import AcceptanceMethod
from speculant.core.attention.base import AttentionBackend
from speculant.core.config import EngineConfig
from speculant.proposers.base import Proposer, ProposerContext
from speculant.scorers.base import Scorer


@dataclass
class SpecComponents:
    proposer: Proposer | None = None
    scorer: Scorer | None = None
    acceptance: AcceptanceMethod | None = None

    @property
    def want_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.capabilities.needs_target_hidden_states


def _registry():
    from speculant.plugins.manager import get_registry

    return get_registry()


def resolve_backend(config: EngineConfig) -> AttentionBackend:
    from speculant.core.compat import resolve_attention_backend_name

    registry = _registry()
    name = resolve_attention_backend_name(config, registry)
    if name is None:
        raise ValueError(f"model.attention_backend = 'auto': no registered attention backend runs on "
                         f"this device; registered: {registry.names('attention_backend')}")
    return registry.get("attention_backend", name)()


def build_spec_components(config: EngineConfig, runner) -> SpecComponents:
    spec = config.speculative
    if not spec.enabled:
        return SpecComponents()
    registry = _registry()
    proposer_cls = registry.get("proposer", spec.proposer)
    scorer_cls = registry.get("scorer", spec.scorer)
    acceptance_cls = registry.get("acceptance", spec.acceptance)
    proposer = proposer_cls(proposer_cls.Options.model_validate(spec.proposer_options),
                            ProposerContext(config=config, target=runner))
    return SpecComponents(
        proposer=proposer,
        scorer=scorer_cls(scorer_cls.Options()),
        acceptance=acceptance_cls(acceptance_cls.Options.model_validate(spec.acceptance_options)),
    )
