"""Incremental detokenization: a request's output text, extended in O(1) per token.

``decoder(ids)`` is ``tokenizer.decode(ids, skip_special_tokens=True)``. The text
of the output tokens is built by decoding only a short window at the end:

* the window starts with *context* tokens whose text was already emitted; the new
  text is what decoding the window adds after the context's own text. The
  context makes the decode of the new tokens see what precedes them, e.g.
  SentencePiece / Llama-style tokenizers drop the leading space of the first
  token they decode (``▁Hello`` alone is "Hello", after ``▁Hi`` it is " Hello").
* a decode that ends in U+FFFD may end in an incomplete character whose next
  byte has not been sampled yet (byte-level BPE, byte fallback): its text stays
  *pending* and the window grows until a decode ends on a whole character. Then
  the pending text is confirmed and the new tokens become the next context.
* tokens the decoder always drops (special tokens under skip_special_tokens)
  never enter the window.

This equals the full decode whenever splitting the decode at a confirmed
boundary does not change it, which holds for byte-level BPE and Metaspace /
SentencePiece decoders. A tokenizer whose decode rewrites text across such a
boundary (WordPiece clean-up of " ." or a byte-fallback group that fails as a
whole) can make the incremental text differ in such spots: it is used for stop
strings and streaming, while a finished request's text is one full decode.

``Detokenizer`` is immutable: ``feed`` returns a new state, so a step planning a
request's new state on a copy never changes the live request's text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

REPLACEMENT = "\ufffd"  # what decoding an incomplete or invalid UTF-8 sequence gives


class TextDecoder:
    """``decode`` (token ids -> text, special tokens skipped) and the ids it always drops."""

    def __init__(self, decode: Callable[[list[int]], str], skip_ids: frozenset[int] = frozenset()) -> None:
        self.decode = decode
        self.skip_ids = frozenset(skip_ids)

    def __call__(self, token_ids: Sequence[int]) -> str:
        return self.decode(list(token_ids))

    @classmethod
    def for_tokenizer(cls, tokenizer, decode: Callable[[list[int]], str] | None = None) -> TextDecoder:
        """A decoder for ``tokenizer``; ``skip_ids`` are its special tokens that
        ``decode`` turns into nothing (so dropping them changes no decode)."""
        if decode is None:
            def decode(ids: list[int]) -> str:
                return tokenizer.decode(ids, skip_special_tokens=True)
        candidates = set(getattr(tokenizer, "all_special_ids", None) or ())
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        candidates |= {i for i, tok in added.items() if getattr(tok, "special", False)}
        return cls(decode, frozenset(i for i in candidates if isinstance(i, int) and decode([i]) == ""))


@dataclass(frozen=True)
class Detokenizer:
    """The text of the output tokens fed so far (see the module docstring)."""

    text: str = ""  # confirmed: every later decode starts with it
    pending: str = ""  # decoded after ``text`` but may still change (ends in U+FFFD)
    window: tuple[int, ...] = ()  # ids decoded each time: context, then unconfirmed ids
    read: int = 0  # window[:read] is the context
    context: str = ""  # decoder(window[:read])
    consumed: int = 0  # output tokens fed (dropped special tokens included)

    @property
    def full_text(self) -> str:
        """What decoding every fed token gives (builds a new string: O(length))."""
        return self.text + self.pending

    def since(self, start: int) -> str:
        """``full_text[start:]`` without building ``full_text``."""
        return self.text[start:] + self.pending if start < len(self.text) \
            else self.pending[start - len(self.text):]

    def stable_text(self, hold: int = 0) -> str:
        """Text later tokens will only extend: ``full_text`` less a trailing
        U+FFFD run (a character still incomplete) and less ``hold`` more characters."""
        shown = self.pending.rstrip(REPLACEMENT)
        text = self.text + shown if shown else self.text.rstrip(REPLACEMENT)
        return text[: max(0, len(text) - hold)] if hold > 0 else text

    def feed(self, token_ids: Sequence[int], decoder: TextDecoder) -> Detokenizer:
        """The state after ``token_ids`` are appended to the output."""
        consumed = self.consumed + len(token_ids)
        new = tuple(t for t in token_ids if t not in decoder.skip_ids)
        if not new:
            return Detokenizer(self.text, self.pending, self.window, self.read, self.context, consumed)
        window = self.window + new
        decoded = decoder(window)
        if not decoded.endswith(REPLACEMENT):
            text = self.text + decoded[len(self.context):]
            window = window[self.read:]
            return Detokenizer(text, "", window, len(window), decoder(window), consumed)
        return Detokenizer(self.text, decoded[len(self.context):], window, self.read, self.context, consumed)
