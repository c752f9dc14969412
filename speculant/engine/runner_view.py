"""A model runner as plugins see it: the runner's forward and tensors, with the
block manager that allocates its KV blocks.

The runner holds only tensors (weights, the paged caches); which block belongs
to which sequence is the engine's bookkeeping (``block_manager.BlockManager``).
A plugin's ``RunnerView`` pairs the two: the target's runner with the engine's
blocks (what scorers get), or a runner a proposer built for its own model
(``TargetView.new_runner``) with a block manager of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speculant.engine.block_manager import BlockManager
from speculant.interfaces import QuerySpan

if TYPE_CHECKING:  # the runner imports transformers' model classes (~2 s)
    from speculant.model.runner import ForwardOutput, ModelRunner


class PluginRunner:
    """``RunnerView`` over ``runner`` and ``blocks``; every other attribute is the runner's."""

    def __init__(self, runner: ModelRunner, blocks: BlockManager | None = None) -> None:
        self.runner = runner
        self.block_manager = blocks if blocks is not None else BlockManager(runner.num_blocks, runner.block_size)

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    def forward(self, spans: list[QuerySpan], want_hidden: bool = False) -> ForwardOutput:
        return self.runner.forward(spans, want_hidden)

    def __getattr__(self, name: str) -> Any:  # only for names not found above
        return getattr(self.runner, name)
