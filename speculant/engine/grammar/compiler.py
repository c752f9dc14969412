"""Compile structured-output constraints for one engine's tokenizer (llguidance).

Why llguidance (and not xgrammar): it is installed with the engine's test
extras and runs on the CPU with no GPU or compiler step; it compiles a grammar
lazily (a new JSON schema costs milliseconds, with no per-grammar token-mask
precomputation, which matters when every request brings its own schema); its
matcher rolls back consumed tokens cheaply; and it computes the masks of a
whole speculative run in one call (``fill_next_token_bitmask_par_with_draft_tokens``).
xgrammar offers the same constraint kinds with a precomputed adaptive mask
cache (faster per-token masks after a costlier compile), but is not installed
here.

``GrammarCompiler`` builds llguidance's tokenizer once (from the Hugging Face
tokenizer, with the engine's EOS ids and logit width) and caches compiled
grammars, least recently used first out, keyed by ``(kind, source)``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from speculant.config.structured import StructuredOutput

if TYPE_CHECKING:
    import llguidance

JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""JSON layout under a schema: ``{"a": 1, "b": [2, 3]}``, no free whitespace (a model
can otherwise emit whitespace without end); a schema's ``x-guidance`` overrides it."""
GRAMMAR_CACHE_SIZE = 256


class GrammarError(ValueError):
    """A structured-output constraint the engine cannot compile (HTTP 400)."""


def load_llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
    except ImportError as exc:  # pragma: no cover - an optional dependency
        raise GrammarError("structured output needs the llguidance package, which is not installed "
                           f"({exc}); install it with pip install 'speculant[structured]'") from None
    return llguidance


class GrammarCompiler:
    """Compiled grammars for one tokenizer; thread-safe (``add_request`` runs anywhere)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int],
                 cache_size: int = GRAMMAR_CACHE_SIZE) -> None:
        self._hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size  # columns of the target's logits
        self.eos_token_ids = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.num_compiled = 0
        self.num_cache_hits = 0

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer, built on first use (once per engine)."""
        with self._lock:
            if self._tokenizer is None:
                llg = load_llguidance()
                try:
                    # llguidance's vocabulary covers both the logits' columns and the tokenizer's ids
                    n_vocab = max(self.vocab_size, len(self._hf_tokenizer))
                    self._tokenizer = llg.hf.from_tokenizer(self._hf_tokenizer, n_vocab=n_vocab,
                                                            eos_token=self.eos_token_ids or None)
                except ValueError as exc:
                    raise GrammarError(f"structured output cannot use this model's tokenizer ({exc}); "
                                       "it needs a fast (Rust) Hugging Face tokenizer") from None
            return self._tokenizer

    def compile(self, spec: StructuredOutput) -> str:
        """llguidance's grammar text for ``spec``, checked against the tokenizer;
        raises ``GrammarError`` naming the problem."""
        key = (spec.kind, spec.source)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                self.num_cache_hits += 1
                return self._cache[key]
        grammar = self._grammar(spec)
        is_error, messages = load_llguidance().LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise GrammarError(f"structured output {spec.kind} cannot be compiled: {_first_line(messages)}; "
                               f"fix the {_what(spec)}")
        with self._lock:
            self._cache[key] = grammar
            self.num_compiled += 1
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return grammar

    def matcher(self, spec: StructuredOutput) -> llguidance.LLMatcher:
        """A fresh matcher at the start of ``spec``'s grammar."""
        m = load_llguidance().LLMatcher(self.tokenizer, self.compile(spec), log_level=0)
        if m.is_error():
            raise GrammarError(f"structured output {spec.kind} cannot be compiled: {_first_line([m.get_error()])}; "
                               f"fix the {_what(spec)}")
        return m

    @staticmethod
    def _grammar(spec: StructuredOutput) -> str:
        llm = load_llguidance().LLMatcher
        try:
            if spec.kind == "json_schema":
                return str(llm.grammar_from_json_schema(spec.source, defaults=JSON_DEFAULTS))
            if spec.kind == "json_object":
                return str(llm.grammar_from_json_schema('{"type": "object"}', defaults=JSON_DEFAULTS))
            if spec.kind == "regex":
                return str(llm.grammar_from_regex(spec.source))
            return str(llm.grammar_from_lark(spec.source))
        except ValueError as exc:
            raise GrammarError(f"structured output {spec.kind} cannot be compiled: {exc}; fix the "
                               f"{_what(spec)}") from None


def _what(spec: StructuredOutput) -> str:
    return {"json_schema": "JSON schema", "json_object": "request", "regex": "regular expression",
            "grammar": "Lark grammar"}[spec.kind]


def _first_line(messages: list[str]) -> str:
    text = " ".join(m.strip() for m in messages if m.strip()) or "unknown error"
    return " ".join(text.split())[:400]
