"""Resolve the configured plugins (attention backend, proposer, scorer,
acceptance method) from a registry and build them.

Core never names a concrete proposer or scorer: names come from the config
and classes from the registry the engine passes in. A proposer sees the target
through a ``TargetView`` (``target_view``), never the model runner itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from speculant.config.compat import resolve_attention_backend_name
from speculant.config.models import CacheConfig, EngineConfig, ModelConfig
from speculant.engine.runner_view import SequenceRunner
from speculant.interfaces import AcceptanceMethod, AttentionBackend, Proposer, ProposerContext, Scorer, TargetView
from speculant.model.runner import ModelRunner

if TYPE_CHECKING:
    from speculant.interfaces.catalog import PluginCatalog as Registry

FINAL_NORM_PATHS = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f", "decoder.final_layer_norm")
"""Where transformers' decoder stacks keep the norm before the LM head (llama-likes, phi, gpt_neox /
stablelm, gpt2, ..., opt), relative to ``model.base_model``."""


@dataclass
class SpecComponents:
    proposer: Proposer | None = None
    scorer: Scorer | None = None
    acceptance: AcceptanceMethod | None = None

    @property
    def want_hidden(self) -> bool:
        if self.proposer is None:
            return False
        caps = self.proposer.capabilities
        return caps.needs_target_hidden_states or caps.needs_prompt_hidden_states


def resolve_backend(config: EngineConfig, registry: Registry) -> AttentionBackend:
    name = resolve_attention_backend_name(config, registry)
    if name is None:
        raise ValueError(f"model.attention_backend = 'auto': no registered attention backend runs on "
                         f"this device; registered: {registry.names('attention_backend')}")
    return registry.get("attention_backend", name)()


def final_norm(model: torch.nn.Module) -> torch.nn.Module | None:
    """The norm the model applies before its LM head, or None where it has none we know of."""
    for path in FINAL_NORM_PATHS:
        module: object = model.base_model
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


def target_view(runner: ModelRunner) -> TargetView:
    """What a proposer may read about the target (``ProposerContext.target``),
    and a factory for its own runner on the target's backend and KV geometry."""

    def new_runner(model: ModelConfig, option: str = "speculative.proposer_options.model") -> SequenceRunner:
        # never more blocks than the target: a draft's cache covers at most the target's positions
        cache = CacheConfig(block_size=runner.block_size, num_blocks=runner.num_blocks)
        return SequenceRunner(ModelRunner(model, cache, runner.backend, path_option=option, tokenizer_option=option,
                                        graph_limits=runner.graph_limits), name="proposer")  # own blocks

    return TargetView(
        tokenizer=runner.tokenizer, vocab_size=runner.vocab_size, device=runner.device, dtype=runner.model.dtype,
        max_model_len=runner.max_model_len, block_size=runner.block_size, num_blocks=runner.num_blocks,
        output_embedding=runner.model.get_output_embeddings(), final_norm=final_norm(runner.model),
        input_embedding=runner.model.get_input_embeddings(),
        new_runner=new_runner)


def build_spec_components(config: EngineConfig, runner: ModelRunner, registry: Registry) -> SpecComponents:
    spec = config.speculative
    if spec.proposer is None:  # speculation off
        return SpecComponents()
    proposer_cls = registry.get("proposer", spec.proposer)
    scorer_cls = registry.get("scorer", spec.scorer)
    acceptance_cls = registry.get("acceptance", spec.acceptance)
    proposer = proposer_cls(proposer_cls.Options.model_validate(spec.proposer_options),
                            ProposerContext(config=config, target=target_view(runner)))
    return SpecComponents(
        proposer=proposer,
        scorer=scorer_cls(),
        acceptance=acceptance_cls(acceptance_cls.Options.model_validate(spec.acceptance_options)),
    )
