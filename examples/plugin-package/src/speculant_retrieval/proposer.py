"""``RetrievalProposer``: drafts the text that followed the longest match of the
request's recent tokens in a user-supplied corpus.

When generated text repeats material you can name in advance — the code base a
model is editing, the documents a RAG prompt quotes, boilerplate, templates —
the continuation is often verbatim in that corpus, and the proposer finds it
without running any draft model. Proposals are deterministic, so lossless
acceptance keeps the target's distribution exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from speculant.plugin_api import EngineConfigView, Proposals, Proposer, ProposerCapabilities, ProposerContext, StepBatch
from speculant_retrieval.suffix_automaton import SuffixAutomaton

DOCUMENT_SEPARATOR = -1
"""Placed between corpus files; no query token equals it, so matches never
cross from one file into the next."""


class RetrievalOptions(BaseModel):
    """Options of the ``retrieval`` proposer (``speculative.proposer_options``)."""

    model_config = ConfigDict(extra="forbid")

    corpus_path: str
    """A UTF-8 text file, or a directory whose text files (recursively) form the corpus."""
    min_match: int = Field(default=3, ge=1)
    """Propose only when at least this many trailing tokens match the corpus."""
    max_match: int = Field(default=64, ge=1)
    """Match at most this many trailing tokens (bounds the work per step)."""
    glob: str = "**/*"
    """Which files of a ``corpus_path`` directory to read."""

    @model_validator(mode="after")
    def _check_range(self) -> RetrievalOptions:
        if self.max_match < self.min_match:
            raise ValueError(f"max_match={self.max_match} is below min_match={self.min_match}: "
                             f"set max_match to at least {self.min_match}")
        return self


def corpus_files(options: RetrievalOptions) -> list[Path]:
    root = Path(options.corpus_path).expanduser()
    if root.is_file():
        return [root]
    return sorted(p for p in root.glob(options.glob) if p.is_file())


def read_corpus(options: RetrievalOptions) -> list[str]:
    """The text of every corpus file that decodes as UTF-8 (others are skipped)."""
    texts = []
    for path in corpus_files(options):
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return texts


class RetrievalProposer(Proposer):
    """Proposes the continuation of the longest suffix match in a corpus."""

    name = "retrieval"
    api_version = "3.0"
    capabilities = ProposerCapabilities(
        needs_target_hidden_states=False,
        supports_chunked_prefill=True,  # reads only token ids, never the target's internals
        draft_probs="one_hot",  # proposals are a deterministic function of the context
        max_num_speculative_tokens=None,
        supports_prefix_caching=True,  # keeps no per-request state: a cached prefix changes nothing for it
    )
    Options: ClassVar[type[BaseModel]] = RetrievalOptions

    def __init__(self, options: RetrievalOptions, context: ProposerContext) -> None:
        super().__init__(options, context)
        tokenizer = context.target.tokenizer
        tokens: list[int] = []
        for text in read_corpus(options):
            if tokens:
                tokens.append(DOCUMENT_SEPARATOR)
            tokens.extend(tokenizer.encode(text, add_special_tokens=False))
        self.corpus = tokens
        self.index = SuffixAutomaton(tokens)

    def propose_for(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` corpus tokens that followed the longest match of the
        last ``max_match`` tokens of ``token_ids`` (none below ``min_match``)."""
        if k <= 0:
            return []
        length, end = self.index.longest_suffix_match(token_ids[-self.options.max_match:])
        if length < self.options.min_match:
            return []
        out = []
        for tok in self.corpus[end:end + k]:
            if tok == DOCUMENT_SEPARATOR:
                break
            out.append(tok)
        return out

    def propose(self, batch: StepBatch) -> Proposals:
        rows = [self.propose_for(d.request.token_ids, d.num_spec_tokens) for d in batch.decodes]
        return Proposals.from_lists(rows)

    @classmethod
    def validate_against(cls, options: RetrievalOptions, config: EngineConfigView) -> list[str]:
        key = "speculative.proposer_options.corpus_path"
        root = Path(options.corpus_path).expanduser()
        if not root.exists():
            return [f"{key} = {options.corpus_path!r}: no such file or directory: point it at a UTF-8 text "
                    f"file or a directory of them"]
        if not corpus_files(options):
            return [f"{key} = {options.corpus_path!r}: the directory has no files matching "
                    f"glob {options.glob!r}: add text files or change speculative.proposer_options.glob"]
        return []
