"""What the contract needs to say about engine objects it does not own.

The ABCs in ``components`` receive a model runner, a step's batch and the
engine config, which live in layers above this one. Naming those classes here
would close an import circle (the engine imports the contract), so the
contract names them through the views below:

- ``RunnerView``: the part of a model runner a scorer or a proposer calls
  (``speculant.model.runner.ModelRunner`` implements it);
- ``StepBatchView``: the read-only ``speculant.interfaces.batch.StepBatch``
  the engine builds for its plugins each step;
- ``EngineConfigView``: what a plugin may read of the validated engine config
  (``speculant.config.models.EngineConfig`` has it all, and more).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

from speculant.interfaces.batch import StepBatch

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from speculant.interfaces.data import QuerySpan

StepBatchView = StepBatch
"""The step's batch as plugins see it (prefill chunks, then decodes)."""


class ModelSettingsView(Protocol):
    """``EngineConfig.model``, as far as plugins read it (a proposer's own
    model may mirror the target's settings)."""

    @property
    def path(self) -> str: ...

    @property
    def tokenizer(self) -> str | None: ...

    @property
    def dtype(self) -> Literal["auto", "float32", "float64", "bfloat16", "float16"]: ...

    @property
    def device(self) -> Literal["auto", "cpu", "cuda"]: ...

    @property
    def max_model_len(self) -> int | None: ...

    @property
    def attention_backend(self) -> str: ...

    @property
    def linear_dense_max_rows(self) -> int | None: ...

    @property
    def cuda_graphs(self) -> Literal["auto", "off"]: ...

    @property
    def fast_forward(self) -> Literal["auto", "on", "off"]: ...

    @property
    def quantization(self) -> Literal["gguf", "dequantize"]: ...


class SpeculativeSettingsView(Protocol):
    """``EngineConfig.speculative``, as far as plugins read it."""

    @property
    def proposer(self) -> str | None: ...

    @property
    def scorer(self) -> str: ...

    @property
    def acceptance(self) -> str: ...

    @property
    def num_speculative_tokens(self) -> int: ...

    @property
    def tree_width(self) -> int: ...

    @property
    def max_tree_tokens(self) -> int: ...

    @property
    def proposer_options(self) -> Any: ...


class EngineConfigView(Protocol):
    """The validated engine config, read-only, as a proposer's ``context.config``
    and ``validate_against`` receive it."""

    @property
    def model(self) -> ModelSettingsView: ...

    @property
    def speculative(self) -> SpeculativeSettingsView: ...


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
