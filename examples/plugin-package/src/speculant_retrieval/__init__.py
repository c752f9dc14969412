"""speculant-retrieval: a Speculant proposer that drafts from a text corpus."""

from speculant_retrieval.proposer import RetrievalOptions, RetrievalProposer

__all__ = ["RetrievalOptions", "RetrievalProposer"]
__version__ = "0.1.0"
