"""The built-in plugin: Speculant's own proposers, scorers, acceptance methods
and attention backend.

It is declared in our ``pyproject.toml`` as the ``builtin`` entry point of the
``speculant.plugins`` group, so it is discovered exactly like a third-party
plugin (the manager only guarantees it loads first and is never filtered out
by ``SPECULANT_PLUGINS``).
"""

from __future__ import annotations

from speculant.acceptance.rejection import RejectionSampler
from speculant.acceptance.typical import TypicalAcceptance
from speculant.model.attention.cpu_kernel import CpuKernelAttentionBackend
from speculant.model.attention.torch_ref import TorchAttentionBackend
from speculant.model.attention.triton_backend import TritonAttentionBackend
from speculant.plugins.hookspecs import RegisterCallback, hookimpl
from speculant.proposers.draft_model import DraftModelProposer
from speculant.proposers.eagle.proposer import EagleProposer
from speculant.proposers.heads.medusa import MedusaProposer
from speculant.proposers.heads.mlp_speculator import MLPSpeculatorProposer
from speculant.proposers.hybrid import DraftSuffixProposer, EagleSuffixProposer
from speculant.proposers.ngram import NgramProposer
from speculant.proposers.suffix import SuffixProposer
from speculant.scorers.batch_expansion import BatchExpansionScorer
from speculant.scorers.mqa import MQAScorer


@hookimpl
def register_proposers(register: RegisterCallback) -> None:
    register(NgramProposer)
    register(DraftModelProposer)
    register(MedusaProposer)
    register(MLPSpeculatorProposer)
    register(EagleProposer)
    register(SuffixProposer)
    register(EagleSuffixProposer)
    register(DraftSuffixProposer)


@hookimpl
def register_scorers(register: RegisterCallback) -> None:
    register(MQAScorer)
    register(BatchExpansionScorer)


@hookimpl
def register_acceptance_methods(register: RegisterCallback) -> None:
    register(RejectionSampler)
    register(TypicalAcceptance)


@hookimpl
def register_attention_backends(register: RegisterCallback) -> None:
    register(TorchAttentionBackend)
    register(CpuKernelAttentionBackend)
    register(TritonAttentionBackend)
