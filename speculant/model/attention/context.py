"""The forward context: what the attention seam needs during one forward.

Set with ``with forward_context(ctx):`` so an exception can never leave a
stale context behind for the next forward.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from speculant.interfaces import AttentionBackend


@dataclass(slots=True)
class ForwardContext:
    backend: AttentionBackend
    metadata: Any
    key_caches: list[torch.Tensor]  # per layer [num_blocks, block_size, H_kv, D]
    value_caches: list[torch.Tensor]
    on_layer: Callable[[Any], None] | None = None
    """Probe hook: when set, the seam calls it with an ``AttentionCall`` record
    instead of attending (used once at load, see ``seam_probe``)."""


_CURRENT: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "speculant_forward_context", default=None
)


@contextlib.contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def current_forward_context() -> ForwardContext:
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError(
            "a model loaded with attn_implementation='speculant' was called outside the engine; "
            "run it through speculant's ModelRunner, or load it with another attn_implementation"
        )
    return ctx
