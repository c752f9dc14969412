"""Refuse a prompt that cannot fit ``max_model_len`` before tokenizing it.

Tokenizing megabytes of text takes seconds, so a prompt that is plainly too
long is refused by its length in characters. The bound must never refuse a
prompt that would fit, and it is derived from the tokenizer's own
description (``tokenizer.json``), once, when the model loads:

    len(text) <= shrink * longest * num_tokens(text)

``longest`` is the longest token in the vocabulary (added and special tokens
included), in the characters the BPE model sees: the text after the
normalizer and the pre-tokenizer, where a byte-level tokenizer has turned each
character into its 1-4 UTF-8 bytes and a SentencePiece-style one spaces into
``▁``. ``shrink`` bounds how many input characters one character the
normalizer leaves can stand for: 1, except for NFC / NFKC, which compose at
most 4 code points into one (4 is the longest canonical decomposition of any
code point, and Unicode adds no new compositions). If every character the
model sees is covered by some token, each token covering at most
``longest`` of them, and the normalizer and pre-tokenizer drop nothing, the
inequality holds. So a text of more than ``shrink * longest *
(max_model_len - 1)`` characters has at least ``max_model_len`` tokens, which
the engine refuses anyway (it needs room for one generated token).

Anything that could make one token stand for an unbounded run of characters
turns the check off (``limit() is None``, logged at startup; such prompts are
then tokenized, in a worker thread, and refused by the engine): a normalizer
that removes or merges characters (Strip, StripAccents, BERT's cleaning,
SentencePiece's precompiled map, Replace with a shorter or a regex
replacement), a pre-tokenizer that drops them (Whitespace, a Split that
removes its matches), an added token that swallows the spaces beside it
(lstrip / rstrip), a model other than BPE (WordPiece turns a long word into
one [UNK]), a BPE that can drop unknown characters (no unk token) or fuse
runs of them into one unk, unless every byte has a token (byte-level
alphabet, or byte fallback), and a tokenizer class that changes the text
before the backend sees it.
"""

from __future__ import annotations

import json
from typing import Any

from speculant.server.errors import PROMPT_TOO_LONG, APIError

COMPOSE_FACTOR = 4
"""Code points NFC / NFKC may compose into one: the longest canonical
decomposition of any code point (tests/server/test_prompt_limit.py checks it
against ``unicodedata``)."""

_ENCODE_PATH = ("__call__", "_call_one", "encode_plus", "_encode_plus", "_batch_encode_plus",
                "prepare_for_tokenization")
_SAME_LENGTH_NORMALIZERS = {"Prepend", "Lowercase", "NFD", "NFKD", "ByteLevel"}
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation"}


class Unbounded(Exception):
    """The tokenizer may let one token stand for an unbounded run of characters."""


def max_chars_per_token(tokenizer: Any) -> int:
    """``shrink * longest`` of the module docstring; raises ``Unbounded`` naming
    the feature that rules a bound out."""
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise Unbounded(f"{type(tokenizer).__name__} is not a fast (tokenizers-backed) tokenizer")
    changed = [n for n in _ENCODE_PATH if getattr(type(tokenizer), n, None) is not
               getattr(PreTrainedTokenizerFast, n, None)]
    if changed:
        raise Unbounded(f"{type(tokenizer).__name__} overrides {', '.join(changed)}")
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    shrink = _shrink(spec.get("normalizer"))
    pre = _pre_tokenizer_types(spec.get("pre_tokenizer"))
    return shrink * _longest_token(spec, byte_level="ByteLevel" in pre or _byte_level_normalizer(spec))


def _shrink(normalizer: dict | None) -> int:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        out = 1
        for inner in normalizer.get("normalizers", []):
            out *= _shrink(inner)
        return out
    if kind in _SAME_LENGTH_NORMALIZERS:
        return 1
    if kind in ("NFC", "NFKC"):
        return COMPOSE_FACTOR
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}), normalizer.get("content", "")
        literal = pattern.get("String") if isinstance(pattern, dict) else None
        if literal and len(content) >= len(literal):
            return 1
        raise Unbounded(f"its normalizer replaces {pattern!r} with {content!r}, which may shorten the text")
    raise Unbounded(f"its normalizer {kind} may remove or merge characters")


def _pre_tokenizer_types(pre: dict | None) -> set[str]:
    if pre is None:
        return set()
    kind = pre.get("type")
    if kind == "Sequence":
        return set().union(*(_pre_tokenizer_types(p) for p in pre.get("pretokenizers", [])))
    if kind not in _KEEPING_PRE_TOKENIZERS:
        raise Unbounded(f"its pre-tokenizer {kind} may drop characters")
    if pre.get("behavior") == "Removed":
        raise Unbounded(f"its pre-tokenizer {kind} removes what it splits on")
    return {str(kind)}


def _byte_level_normalizer(spec: dict) -> bool:
    norm = spec.get("normalizer") or {}
    return norm.get("type") == "ByteLevel" or any(n.get("type") == "ByteLevel" for n in norm.get("normalizers", []))


def _longest_token(spec: dict, byte_level: bool) -> int:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise Unbounded(f"its model is {model.get('type')}, not BPE (an unknown word may become one token)")
    added = spec.get("added_tokens") or []
    swallowing = [a["content"] for a in added if a.get("lstrip") or a.get("rstrip")]
    if swallowing:
        raise Unbounded(f"added token {swallowing[0]!r} absorbs the whitespace beside it (lstrip/rstrip)")
    vocab: dict[str, int] = model.get("vocab") or {}
    if not _every_byte_has_a_token(vocab, byte_level, bool(model.get("byte_fallback"))):
        if model.get("unk_token") is None:
            raise Unbounded("a character outside its vocabulary is dropped (BPE without an unk token)")
        if model.get("fuse_unk"):
            raise Unbounded("a run of characters outside its vocabulary becomes one unk token (fuse_unk)")
    return max([1, *map(len, vocab), *(len(a["content"]) for a in added)])


def _every_byte_has_a_token(vocab: dict[str, int], byte_level: bool, byte_fallback: bool) -> bool:
    if byte_level:
        from tokenizers.pre_tokenizers import ByteLevel

        if all(c in vocab for c in ByteLevel.alphabet()):
            return True
    return byte_fallback and all(f"<0x{b:02X}>" in vocab for b in range(256))


class PromptLimit:
    """The length checks the server makes before a prompt reaches the engine."""

    def __init__(self, max_model_len: int, chars_per_token: int | None) -> None:
        self.max_model_len = max_model_len
        self.chars_per_token = chars_per_token
        self.max_chars = None if chars_per_token is None else chars_per_token * (max_model_len - 1)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, max_model_len: int) -> tuple[PromptLimit, str | None]:
        """The limit, and why the character check is off (None when it is on)."""
        try:
            return cls(max_model_len, max_chars_per_token(tokenizer)), None
        except Unbounded as exc:
            return cls(max_model_len, None), str(exc)

    def check(self, prompt: str | list[int], param: str, what: str = "prompt") -> None:
        """400 for a prompt certain not to fit (a str over ``max_chars``, or as
        many token ids as ``max_model_len``); anything else is left to the engine."""
        n, limit = len(prompt), self.max_model_len
        if isinstance(prompt, list) and n >= limit:
            raise APIError(400, f"prompt has {n} tokens but max_model_len is {limit}, leaving no room to generate; "
                                "shorten the prompt or raise model.max_model_len", param=param, code=PROMPT_TOO_LONG)
        if isinstance(prompt, str) and self.max_chars is not None and n > self.max_chars:
            raise APIError(400, f"{what} has {n} characters; a token of this model stands for at most "
                                f"{self.chars_per_token} of them, so that is at least {limit} tokens, and "
                                f"max_model_len is {limit} (room must be left to generate); shorten it to under "
                                f"{limit} tokens, or raise model.max_model_len", param=param, code=PROMPT_TOO_LONG)
