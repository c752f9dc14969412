"""Capability flags that proposers, scorers, acceptance methods and attention
backends declare as class data, and the options model of plugins without options.

Core code never compares plugin names: it reads these flags. The single checker
that turns flags into "supported or not, and why" lives in
``speculant.config.compat`` and is shared by config validation, the engine and
the compatibility matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

DraftProbsKind = Literal["full", "one_hot", "none"]


class NoOptions(BaseModel):
    """Options model for plugins that take none: any key is an error."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ProposerCapabilities:
    needs_target_hidden_states: bool = False
    """The proposer reads the target's final hidden states in ``Scores`` at commit
    (at least at the rows that produced each request's newest token)."""
    supports_chunked_prefill: bool = True
    """The proposer keeps working when a prompt is split across steps."""
    draft_probs: DraftProbsKind = "one_hot"
    """What the proposer returns as draft probabilities: the full distribution it
    sampled from, an implicit one-hot on the proposed token, or nothing usable."""
    max_num_speculative_tokens: int | None = None
    """Largest k the proposer can produce per step (None: no limit)."""
    needs_prompt_hidden_states: bool = False
    """The proposer also reads the hidden state at every prompt position
    (``Scores.prompt_hidden``, each prefill chunk as it is computed). Such a
    proposer must support chunked prefill or the checker refuses chunking."""
    supports_prefix_caching: bool = False
    """The proposer serves a request whose prefill starts after a cached prefix
    (its first chunk's ``start`` > 0): it holds no state that only the skipped
    chunks would have built, or it restores that state in ``restore_prefix``.
    False (the default, safe for a proposer written before prefix caching): the
    engine skips no cached prefix while this proposer runs."""
    proposes_trees: bool = False
    """The proposer may return token trees (``Proposals.parents``) when
    ``speculative.tree_width`` > 1: at most ``tree_width`` children per node,
    ``num_speculative_tokens`` levels and the decode's ``num_spec_tokens`` nodes.
    The engine refuses a tree from a proposer without the flag."""


@dataclass(frozen=True)
class ScorerCapabilities:
    supports_mixed_prefill_decode: bool = True
    """Prefill chunks and speculating decodes may share one target forward."""
    needs_multi_token_queries: bool = False
    """The attention backend must accept several query tokens per sequence over a
    cached prefix (an MQA scorer does; batch expansion needs single-token rows)."""
    verifies_trees: bool = False
    """Scores a token tree (``Proposals.parents``) in one forward, each node at
    its depth's position and seeing only its ancestors (an attention backend
    with ``tree_attention``)."""
    no_trees_reason: str = "it does not declare verifies_trees"
    """Why the scorer cannot verify trees (shown where ``verifies_trees`` is false)."""


@dataclass(frozen=True)
class AcceptanceCapabilities:
    needs_draft_probs: bool = False
    """Needs the full draft distribution (a proposer with draft_probs='full')."""
    lossless: bool = True
    """Output distribution equals the target's exactly."""
    supports_sampling: bool = True
    """Works with temperature > 0 (every method supports greedy)."""
    supports_structured_output: bool = False
    """Emits only tokens its ``target_logprobs`` give positive probability (the
    engine sets grammar-forbidden tokens to -inf there, at every verified row), so
    a grammar holds under it. False (the default, safe for a method written
    before structured output): the engine refuses structured requests with it.
    Proposers and scorers need no flag: the engine cuts and masks around them."""
    accepts_trees: bool = False
    """Accepts token trees (``accept_tree``): the longest path matching the target's
    argmax when greedy, and a lossless multi-candidate scheme when sampling."""


@dataclass(frozen=True)
class AttentionBackendCapabilities:
    multi_token_queries: bool = True
    """Accepts query runs of length > 1 over a cached, paged prefix."""
    devices: tuple[str, ...] = ("cpu", "cuda")
    """torch device types the backend runs on."""
    priority: int = 0
    """``attention_backend = 'auto'`` picks the highest-priority backend that
    runs on the model's device and dtype (the reference backend has 0)."""
    dtypes: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16")
    """``model.dtype`` values the backend computes (the KV cache has the model's dtype)."""
    unavailable: str | None = None
    """Why the backend cannot run in this installation (a package it needs is
    missing, with how to get it), None when it can: ``auto`` passes it over and
    the checker refuses it with this text."""
    graph_capturable: bool = False
    """A forward through this backend may be captured in a CUDA graph and
    replayed with its metadata tensors refilled: the metadata holds only device
    tensors and host ints fixed per captured shape (``max_query_len``), and the
    backend handles empty spans and a padding span that sees no key
    (``seq_len`` 0). ``model.cuda_graphs = 'auto'`` graphs only such backends."""
    tree_attention: bool = False
    """Honours ``SpanTensors.tree_masks``: a tree span's tokens see the cached
    prefix and their own ancestors only (token-tree verification)."""
