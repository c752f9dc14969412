"""What the contract needs to say about engine objects it does not own.

The ABCs in ``components`` receive a model runner, a step's batch and the
engine config, which live in layers above this one. Naming those classes here
would close an import circle (the engine imports the contract), so the
contract names them through the views below:

- ``RunnerView``: the part of a model runner a scorer or a proposer calls
  (``speculant.model.runner.ModelRunner`` implements it);
- ``StepBatchView`` / ``EngineConfigView``: the step's batch
  (``speculant.engine.batch.StepBatch``) and the validated engine config
  (``speculant.config.models.EngineConfig``). Plugins read many of their
  fields, so the contract types them loosely and plugins annotate with the
  concrete classes, which ``speculant.plugin_api`` exports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from speculant.interfaces.data import QuerySpan

StepBatchView = Any
"""A ``speculant.engine.batch.StepBatch`` (prefill chunks, then decodes)."""

EngineConfigView = Any
"""A ``speculant.config.models.EngineConfig``."""


class ForwardResult(Protocol):
    """What one forward returns (``speculant.model.runner.ForwardOutput``)."""

    @property
    def logits(self) -> torch.Tensor:  # [R, V] float32, one row per position in the spans' ``logits_at``
        ...

    @property
    def hidden_states(self) -> torch.Tensor | None:  # [R, H] final normed hidden states at those rows, if asked
        ...

    @property
    def token_hidden(self) -> torch.Tensor | None:  # [T, H] the same at every token of the forward, if asked
        ...


class BlockTables(Protocol):
    """A runner's KV block allocator, as its callers use it."""

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        ...

    def can_allocate(self, seq_id: str, num_tokens: int, prefix: Sequence[int] = ()) -> bool:
        """Whether ``allocate`` with these arguments would succeed."""
        ...

    def allocate(self, seq_id: str, num_tokens: int, prefix: Sequence[int] = ()) -> list[int]:
        """Grow ``seq_id``'s block table to hold ``num_tokens`` and return it; a
        new sequence may start with ``prefix``, cached blocks it shares."""
        ...

    def match_prefix(self, keys: Sequence[bytes]) -> list[int]:
        """The cached blocks holding ``keys[0], keys[1], ...``, up to the first missing one."""
        ...

    def cache_blocks(self, seq_id: str, keys: Sequence[bytes], num_full: int) -> None:
        """Key ``seq_id``'s first ``num_full`` blocks (full of committed tokens' K/V) with ``keys``."""
        ...

    def free(self, seq_id: str) -> None:
        """Release every block of ``seq_id``."""
        ...

    def block_table(self, seq_id: str) -> list[int]:
        """``seq_id``'s block ids, in sequence order."""
        ...


class RunnerView(Protocol):
    """A model runner: one forward over flattened query spans on a paged cache."""

    @property
    def vocab_size(self) -> int:
        """Columns of the model's logits."""
        ...

    @property
    def block_manager(self) -> BlockTables:
        """The allocator of the runner's KV blocks."""
        ...

    def forward(self, spans: list[QuerySpan], want_hidden: bool = False) -> ForwardResult:
        """Run the model over ``spans`` (their K/V written to the cache) and
        return logits at each span's ``logits_at`` rows."""
        ...
