"""What the contract needs to say about engine objects it does not own.

The ABCs in ``components`` receive a model runner, a step's batch and the
engine config, which live in layers above this one. Naming those classes here
would close an import circle (the engine imports the contract), so the
contract names them through the views below:

- ``RunnerView``: the part of a model runner a scorer or a proposer calls,
  with the ``SequenceHandle``s that name its sequences
  (``speculant.engine.runner_view.SequenceRunner`` implements it over the
  model runner and a block manager);
- ``StepBatchView``: the read-only ``speculant.interfaces.batch.StepBatch``
  the engine builds for its plugins each step;
- ``EngineConfigView``: what a plugin may read of the validated engine config
  (``speculant.config.models.EngineConfig`` has it all, and more).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

from speculant.interfaces.batch import StepBatch
from speculant.interfaces.sequence import SequenceHandle

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


class RunnerView(Protocol):
    """A model runner as a plugin drives it: sequences whose KV the runner
    allocates, grows, forks and frees, and one forward over query spans that
    name them.

    A proposer's own runner (``TargetView.new_runner``) holds only the
    sequences the proposer opened; the target's runner, as a scorer gets it,
    holds the sequences of the step being scored (``ScheduledRequest.sequence``)
    until that step ends. Any other handle (another view's, a freed one, one
    of a finished step, one built by hand) is a ``SequenceHandleError`` naming
    it and the fix, and the forward reads and writes nothing. Blocks two
    sequences share after ``fork`` are copied before either writes into them.
    """

    @property
    def name(self) -> str:
        """This view's name (it appears in its handles and errors)."""
        ...

    @property
    def vocab_size(self) -> int:
        """Columns of the model's logits."""
        ...

    @property
    def block_size(self) -> int:
        """Tokens per KV block (the unit of prefix sharing)."""
        ...

    def open_sequence(self, label: str = "", prefix_keys: Sequence[bytes] = ()) -> tuple[SequenceHandle, int]:
        """A new, empty sequence, and how many leading tokens it already holds:
        with ``prefix_keys`` (a request's ``block_hashes``) it starts with the
        cached blocks holding them, up to the first missing one (whole blocks;
        0 without keys)."""
        ...

    def can_grow(self, sequence: SequenceHandle, num_tokens: int) -> bool:
        """Whether ``grow(sequence, num_tokens)`` would find room."""
        ...

    def grow(self, sequence: SequenceHandle, num_tokens: int) -> None:
        """Give ``sequence`` KV slots for positions ``0 .. num_tokens - 1`` (a
        no-op where it has them). A forward may write only where it has slots."""
        ...

    def fork(self, sequence: SequenceHandle, num_tokens: int, label: str = "") -> SequenceHandle:
        """A new sequence whose first ``num_tokens`` positions hold ``sequence``'s
        K/V (shared, copied on write); the parent is unchanged and either may
        be freed first."""
        ...

    def free(self, sequence: SequenceHandle) -> None:
        """Release ``sequence``'s KV; its handle is refused from then on."""
        ...

    def cache_prefix(self, sequence: SequenceHandle, keys: Sequence[bytes], num_full_blocks: int) -> None:
        """Key ``sequence``'s first ``num_full_blocks`` blocks, each full of
        committed tokens' K/V, with ``keys`` so a later ``open_sequence`` may
        share them."""
        ...

    def forward(self, spans: list[QuerySpan], want_hidden: bool = False) -> ForwardResult:
        """Run the model over ``spans`` (their K/V written to their sequences)
        and return logits at each span's ``logits_at`` rows."""
        ...
