"""The ABCs of the four plugin kinds, and the view of the target a proposer gets.

A proposer guesses tokens (``Proposer``), a scorer runs the target over them
(``Scorer``), an acceptance method decides which to keep
(``AcceptanceMethod``) and an attention backend computes paged attention in
every forward (``AttentionBackend``). Each class declares a ``name`` (what the
config says), ``capabilities`` (``capabilities.py``) and an ``Options`` model.
Engine objects appear through the views of ``views.py`` and ``batch.py``, so
this package imports nothing of the layers above it.

Every plugin class also declares the contract version it targets,
``api_version = "3.0"`` (``version.py``): the registry refuses a class that
declares none or another major version.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from speculant.interfaces.capabilities import (
    AcceptanceCapabilities,
    AttentionBackendCapabilities,
    NoOptions,
    ProposerCapabilities,
    ScorerCapabilities,
)

if TYPE_CHECKING:  # annotations only: this module loads without torch (see the package docstring)
    import torch

    from speculant.interfaces.batch import RequestView
    from speculant.interfaces.data import AcceptedNodes, AcceptedTokens, Proposals, Scores
    from speculant.interfaces.span_tensors import SpanTensors
    from speculant.interfaces.views import EngineConfigView, RunnerView, StepBatchView


@dataclass(frozen=True)
class TargetView:
    """What a proposer may read about the target model, and the one thing it
    may build from it: its own model runner (``new_runner``).

    ``output_embedding``, ``final_norm`` and ``input_embedding`` are the target's own modules,
    shared: read-only (call them; never train, move or modify them). Hidden
    states in ``Scores`` are already normed, so a head applies
    ``output_embedding`` to them directly.
    """

    tokenizer: Any
    """The target's Hugging Face tokenizer."""
    vocab_size: int
    """Columns of the target's logits: proposed ids lie in [0, vocab_size)."""
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    """Longest sequence (prompt + output) the engine runs."""
    block_size: int
    """Tokens per KV block."""
    num_blocks: int
    """Blocks in the target's KV pool."""
    output_embedding: torch.nn.Module
    """The LM head: final hidden states [..., H] -> logits [..., vocab_size]."""
    final_norm: torch.nn.Module | None
    """The norm the target applies before its LM head (None where it has none we know of)."""
    input_embedding: torch.nn.Module
    """The token embedding: ids [...] -> [..., H] (what the target's first layer reads)."""
    new_runner: Callable[..., RunnerView]
    """``new_runner(model_config, option="speculative.proposer_options.model")``: a
    runner (a ``RunnerView``) for the proposer's own model (``model_config``, a
    ``ModelConfig``) on the target's attention backend, with the target's KV
    geometry (``block_size``, ``num_blocks``); its errors name ``option``."""


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer gets at construction: the engine config and a narrow view of the target."""

    config: EngineConfigView
    target: TargetView


class Proposer(ABC):
    """Guesses the continuation of decodes so the target can verify many tokens
    in one forward.

    Lifecycle per step: ``propose(batch)`` sees the whole batch (prefill chunks
    too, so a proposer with its own KV cache keeps it in sync chunk by chunk),
    then ``commit(batch, accepted)`` after acceptance so it can roll back to
    what was kept, and ``free(request_id)`` when a request finishes or is
    preempted. The engine checks ``propose``'s output and survives any
    exception from these methods: on a fault, or when the step fails after
    ``propose``, it calls ``free`` for the affected requests instead of
    ``commit`` (see ``engine/proposer_guard.py``), so after ``free`` a proposer
    must be able to serve a request that is still running. ``batch`` is the
    same object in a step's ``propose`` and ``commit``. A step with no
    prefill chunk and no decode given ``num_spec_tokens`` > 0 calls neither
    (speculation off costs nothing), except ``commit`` for a proposer that
    declares ``needs_target_hidden_states``: it gets the hidden states of
    every step (the only time they exist), without a ``propose``. A proposer that
    follows the sequence (its own KV cache) catches up on the tokens it missed
    when a decode next asks it for proposals.
    """

    name: ClassVar[str]
    capabilities: ClassVar[ProposerCapabilities] = ProposerCapabilities()
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel, context: ProposerContext) -> None:
        self.options = options
        self.context = context

    @abstractmethod
    def propose(self, batch: StepBatchView) -> Proposals:
        """Return up to ``d.num_spec_tokens`` tokens for each ``d`` in
        ``batch.decodes`` (row order = decode order)."""

    def commit(self, batch: StepBatchView, num_accepted: AcceptedNodes, scores: Scores) -> None:  # noqa: B027 - optional: stateless proposers keep nothing
        """Called after acceptance with what was kept per decode (row order =
        ``batch.decodes``): ``num_accepted[i]`` proposals, the nodes
        ``num_accepted.nodes[i]`` (indices into the decode's proposals, root
        first; ``0 .. num_accepted[i] - 1`` for a chain), and the step's target ``Scores`` (with
        hidden states when the proposer declares ``needs_target_hidden_states``:
        ``scores.decode_hidden[scores.cu_num_logits[i] + num_accepted[i]]`` produced decode i's newest
        token, ``scores.prefill_hidden`` the newest token of each prefill that
        ``reports``, ``scores.prompt_hidden`` every row of every prefill chunk).
        Only called when the step's computation succeeded.
        Stateless proposers keep nothing, so the base does nothing."""

    def free(self, request_id: str) -> None:  # noqa: B027 - optional, like commit
        """Drop any state held for ``request_id`` (finished, preempted, or reset
        after a fault). The request may still be running: the next ``propose``
        that sees it must rebuild what it needs from ``request.token_ids`` (or
        propose nothing for it until it can). Stateless proposers hold none."""

    def restore_prefix(self, request: RequestView, num_cached_tokens: int) -> int:
        """Prefix caching (only with ``capabilities.supports_prefix_caching``):
        the target holds ``request``'s first ``num_cached_tokens`` tokens cached
        (whole blocks; ``request.block_hashes`` has their keys) and is about to
        admit it with its first prefill chunk starting there. Restore whatever
        state this proposer keeps for those positions and return how many
        leading tokens the target may skip: at most ``num_cached_tokens``, and
        the target rounds it down to whole blocks and computes the rest. Return
        ``num_cached_tokens`` when what is missing can be rebuilt from token ids
        alone (the default: a proposer that reads only ``request.token_ids``).
        May be called again for the same request (it replaces the state), and
        the request may then wait instead of running (``free`` follows at its
        end either way)."""
        return num_cached_tokens

    @classmethod
    def validate_against(cls, options: Any, config: EngineConfigView) -> list[str]:
        """Extra reasons this proposer cannot serve ``config`` (e.g. a draft
        model whose vocabulary differs from the target's). ``options`` is an
        instance of ``cls.Options`` (typed ``Any`` so that a subclass may
        annotate it with its own options class). Checked at config time; the
        default has none."""
        return []

    @classmethod
    def max_tokens_for(cls, options: Any, config: EngineConfigView) -> int | None:
        """The most proposals per decode this proposer can give with ``options``
        (None: no limit). An unset ``speculative.num_speculative_tokens`` is
        lowered to it; the default is ``capabilities.max_num_speculative_tokens``."""
        return cls.capabilities.max_num_speculative_tokens


class Scorer(ABC):
    """Runs the target once over a step's batch, proposals appended to its decodes."""

    name: ClassVar[str]
    capabilities: ClassVar[ScorerCapabilities] = ScorerCapabilities()
    Options: ClassVar[type[BaseModel]] = NoOptions

    @abstractmethod
    def score(
        self,
        runner: RunnerView,
        batch: StepBatchView,
        proposals: Proposals,
        want_hidden: bool = False,
    ) -> Scores:
        """Run the target once over ``batch`` with ``proposals`` appended to
        its decodes and return the logits that sampling and acceptance need."""


class AcceptanceMethod(ABC):
    """Decides, decode by decode, which proposals to keep and the token emitted after them."""

    name: ClassVar[str]
    capabilities: ClassVar[AcceptanceCapabilities] = AcceptanceCapabilities()
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel | None = None) -> None:
        self.options = options

    @abstractmethod
    def accept(
        self,
        target_logprobs: torch.Tensor,  # [n + T, V] filtered target log-probs, flat (Scores.decode_logits rows)
        draft_token_ids: torch.Tensor,  # [T] long, valid ids
        cu_num_draft_tokens: torch.Tensor,  # [n + 1] long
        draft_probs: torch.Tensor | None,  # [T, V] or None (treated as one-hot)
        greedy: torch.Tensor,  # [n] bool, temperature == 0 rows
        generators: list[torch.Generator],  # one per decode, seeded per request and step
    ) -> AcceptedTokens:
        """Decide, decode by decode, how many proposals to keep and which token
        to emit after them. Greedy decodes keep proposals equal to the target
        argmax and emit the argmax after them."""

    def accept_tree(
        self,
        target_logprobs: torch.Tensor,  # [n + T, V] filtered target log-probs, rows as for ``accept``
        proposals: Proposals,  # with ``parents``: each decode's token tree
        greedy: torch.Tensor,  # [n] bool, temperature == 0 rows
        generators: list[torch.Generator],  # one per decode, seeded per request and step
    ) -> AcceptedTokens:
        """Like ``accept`` for token trees: keep one path of each decode's tree (in
        ``AcceptedTokens.paths``) and the token after it. Only called on a method
        that declares ``accepts_trees``; the base has none."""
        raise NotImplementedError(f"acceptance '{self.name}' does not accept token trees (accepts_trees = false)")


class AttentionBackend(ABC):
    """Paged attention over a flattened, variable-length batch.

    ``build_metadata`` runs once per forward; ``forward`` runs once per layer
    for the whole mixed prefill/decode batch.
    """

    name: ClassVar[str]
    capabilities: ClassVar[AttentionBackendCapabilities] = AttentionBackendCapabilities()
    Options: ClassVar[type[BaseModel]] = NoOptions

    @abstractmethod
    def build_metadata(self, spans: SpanTensors) -> Any:
        """Precompute whatever ``forward`` needs for this batch (once per forward)."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, H_kv, D] (rotary applied)
        value: torch.Tensor,  # [T, H_kv, D]
        key_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
        value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
        metadata: Any,
        scaling: float,
    ) -> torch.Tensor:  # [T, H, D]
        """Write this batch's K/V into the caches, then attend."""
