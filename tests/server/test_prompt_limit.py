"""The character bound that refuses over-long prompts before tokenizing
(``speculant.server.prompt_limit``): it holds (``len(text) <= bound *
num_tokens``) on adversarial texts for the tokenizer shapes it accepts, and
it is off for every tokenizer feature that lets one token stand for an
unbounded run of characters (several shown doing exactly that)."""

from __future__ import annotations

import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from speculant.server.errors import APIError
from speculant.server.prompt_limit import COMPOSE_FACTOR, PromptLimit, Unbounded, max_chars_per_token
from tiny_models import training_text

BYTES = [f"<0x{b:02X}>" for b in range(256)]


def _fast(tok: Tokenizer, **special) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


@pytest.fixture(scope="module")
def byte_level(tokenizer_dir):
    """The tiny models' tokenizer: byte-level BPE, special tokens <|eos|> and <|bos|>."""
    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def sentencepiece_like():
    """Llama-2 / Mistral shape: ``▁`` for spaces (Prepend + Replace), BPE with byte
    fallback, fuse_unk (harmless: every byte has a token)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", *BYTES], show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    return _fast(tok, unk_token="<unk>", bos_token="<s>")


@pytest.fixture(scope="module")
def byte_level_nfc(byte_level):
    """Qwen2 shape: byte-level BPE behind an NFC normalizer."""
    tok = Tokenizer.from_str(byte_level.backend_tokenizer.to_str())
    tok.normalizer = normalizers.NFC()
    return _fast(tok, eos_token="<|eos|>")


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _adversarial(tokenizer) -> list[str]:
    vocab = tokenizer.get_vocab()
    longest = max(vocab, key=len)
    rng = random.Random(0)
    ranges = [(0x20, 0x7E), (0xA0, 0x2FF), (0x300, 0x36F), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0x1100, 0x11FF)]
    randoms = ["".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 400))) for _ in range(60)]
    return [*randoms, " " * 3000, "\n" * 2000, "x" * 5000, "e\u0301" * 800, "\u1100\u1161\u11a8" * 500,
            "\u03b1\u0313\u0300\u0345" * 400, longest * 300, "<|bos|>" * 200, "<s>" * 200, "<0x41>" * 100,
            "☃" * 1000, "\u200b" * 1000, "a\u0301\u0302\u0303" * 300]


@pytest.mark.parametrize("name", ["byte_level", "sentencepiece_like", "byte_level_nfc"])
def test_the_bound_holds_for_the_tokenizers_it_accepts(name, request):
    tokenizer = request.getfixturevalue(name)
    bound = max_chars_per_token(tokenizer)
    vocab_longest = max(len(t) for t in tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True))
    assert bound == vocab_longest * (COMPOSE_FACTOR if name.endswith("nfc") else 1)
    for text in _adversarial(tokenizer):
        assert len(text) <= bound * _count(tokenizer, text), (name, text[:40])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_the_bound_holds_on_any_text(sentencepiece_like, byte_level_nfc, text):
    for tokenizer in (sentencepiece_like, byte_level_nfc):
        assert len(text) <= max_chars_per_token(tokenizer) * _count(tokenizer, text)


def test_compose_factor_is_the_longest_canonical_decomposition():
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert longest == COMPOSE_FACTOR


def _byte_level_with(byte_level, **parts) -> PreTrainedTokenizerFast:
    tok = Tokenizer.from_str(byte_level.backend_tokenizer.to_str())
    for name, value in parts.items():
        setattr(tok, name, value)
    return _fast(tok)


def test_features_that_unbound_a_token_turn_the_check_off(byte_level):
    """Each case names its reason; the first three are shown swallowing a long run of
    characters in a few tokens, which a naive bound would refuse."""
    strip = _byte_level_with(byte_level, normalizer=normalizers.Strip())
    whitespace = _byte_level_with(byte_level, pre_tokenizer=pre_tokenizers.Whitespace())
    fused = Tokenizer(models.BPE(vocab={"<unk>": 0, "a": 1}, merges=[], unk_token="<unk>", fuse_unk=True))
    fused_unk = _fast(fused, unk_token="<unk>")
    for tok, text in ((strip, " " * 5000 + "ab"), (whitespace, "a" + " " * 5000 + "b"), (fused_unk, "☃" * 5000)):
        assert _count(tok, text) <= 3
    no_unk = _fast(Tokenizer(models.BPE(vocab={"a": 0}, merges=[])))
    wordpiece = _fast(Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]")))
    regex = _byte_level_with(byte_level, normalizer=normalizers.Replace(Regex(" +"), " "))
    rstrip = Tokenizer.from_str(byte_level.backend_tokenizer.to_str())
    rstrip.add_special_tokens([AddedToken("<mask>", rstrip=True)])

    class Custom(PreTrainedTokenizerFast):
        def _encode_plus(self, *args, **kwargs):
            return super()._encode_plus(*args, **kwargs)

    cases = [(strip, "Strip"), (whitespace, "Whitespace"), (fused_unk, "fuse_unk"), (no_unk, "without an unk"),
             (wordpiece, "WordPiece"), (regex, "may shorten"), (_fast(rstrip), "lstrip/rstrip"),
             (Custom(tokenizer_object=Tokenizer.from_str(byte_level.backend_tokenizer.to_str())), "_encode_plus"),
             (object(), "not a fast")]
    for tok, reason in cases:
        with pytest.raises(Unbounded, match=reason):
            max_chars_per_token(tok)
        limit, why = PromptLimit.for_tokenizer(tok, 256)
        assert limit.max_chars is None and reason in str(why)
        limit.check("x" * 10**6, "prompt")  # no character check: left to the engine


def test_prompt_limit_refuses_only_what_cannot_fit():
    limit = PromptLimit(max_model_len=256, chars_per_token=16)
    assert limit.max_chars == 16 * 255
    limit.check("x" * limit.max_chars, "prompt")
    limit.check([5] * 255, "prompt")
    with pytest.raises(APIError) as info:
        limit.check("x" * (limit.max_chars + 1), "prompt")
    err = info.value
    assert err.status == 400 and err.param == "prompt"
    assert f"prompt has {limit.max_chars + 1} characters" in err.message and "max_model_len is 256" in err.message
    with pytest.raises(APIError, match="prompt has 256 tokens but max_model_len is 256"):
        limit.check([5] * 256, "prompt")
