"""Incremental detokenization (``speculant/engine/detokenizer.py``) and the stop
rules built on it: the incremental text equals the full decode, stop strings
are found where searching the full text after every token finds them, a step's
planning never touches the live request's text, and decoding work per token is
O(1) (the full-decode approach it replaces was O(output length) per token)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from speculant import LLMEngine, SamplingParams
from speculant.config.models import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from speculant.engine.batch import ScheduledRequest
from speculant.engine.commit import Outcome, apply, plan
from speculant.engine.detokenizer import REPLACEMENT, Detokenizer, TextDecoder
from speculant.engine.request import Request, RequestStatus
from speculant.engine.stop_rules import append_tokens
from tiny_models import build_model, build_tokenizer, random_prompts

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# multi-byte characters (2, 3 and 4 UTF-8 bytes) that BPE merges split across tokens
TEXT = ["Le café est très bon; élève, été, déjà vu. The quick brown fox jumps over the lazy dog.",
        "中文文本：中国 中间 文中。", "smile 🙂 again 🙂🙂 ok 🙂!", "naïve façade — “quotes” … end"] * 8


def byte_level(text: list[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style) trained on ``text``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>", "<bos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>")


def sentencepiece(decoder: str) -> PreTrainedTokenizerFast:
    """Llama-style: Metaspace ("▁" for spaces, one prepended), BPE with byte
    fallback (<0xNN> tokens for characters left out of the vocabulary), and
    the Llama-2 decoder (Replace, ByteFallback, Fuse, Strip the first space) or
    the Metaspace decoder; both drop the first token's leading space."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    if decoder == "llama":
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", "always")])
    ascii_text = [t.encode("ascii", "ignore").decode() for t in TEXT]  # the rest is spelled in bytes
    tok.train_from_iterator(ascii_text, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module", params=["test_bpe", "multilingual_bpe", "sp_llama", "sp_metaspace"])
def case(request, tmp_path_factory):
    """(tokenizer, decoder, strategy of output token sequences)."""
    name = request.param
    if name == "test_bpe":
        tok = build_tokenizer(tmp_path_factory.mktemp("tok"))
    elif name == "multilingual_bpe":
        tok = byte_level(TEXT)
    else:
        tok = sentencepiece(name.removeprefix("sp_"))
    decoder = TextDecoder.for_tokenizer(tok)
    if name.startswith("sp_"):
        # byte-fallback tokens come as whole characters (a group of bytes that is not UTF-8
        # is decoded as a whole into U+FFFDs, see the module docstring); every other id freely
        byte_ids = {tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)}
        chars = "aZ: é中🙂è\n"
        units = st.one_of(st.sampled_from([[i] for i in range(len(tok)) if i not in byte_ids]),
                          st.sampled_from([[tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in c.encode()]
                                           for c in chars]))
        ids = st.lists(units, max_size=30).map(lambda us: [i for u in us for i in u])
    else:  # any id: special tokens, lone bytes of multi-byte characters, invalid UTF-8
        ids = st.lists(st.integers(0, len(tok) - 1), max_size=40)
    return tok, decoder, ids


def runs(ids: list[int], cuts: list[int]) -> list[list[int]]:
    """``ids`` split into consecutive runs of the lengths in ``cuts`` (cycled)."""
    out, i, j = [], 0, 0
    while i < len(ids):
        n = cuts[j % len(cuts)] if cuts else 1
        out.append(ids[i: i + n])
        i, j = i + n, j + 1
    return out


def test_skip_ids_are_the_special_tokens(case):
    tok, decoder, _ = case
    assert decoder.skip_ids == set(tok.all_special_ids) and decoder.skip_ids
    assert all(tok.decode([i], skip_special_tokens=True) == "" for i in decoder.skip_ids)


@SETTINGS
@given(data=st.data(), cuts=st.lists(st.integers(1, 6), max_size=8))
def test_incremental_text_equals_the_full_decode(case, data, cuts):
    """Fed one by one or in runs: wherever the full decode does not end in an
    incomplete character, the incremental text is exactly the full decode, and
    the stable text is always a prefix of the final text."""
    tok, decoder, ids_strategy = case
    ids = data.draw(ids_strategy)
    final = tok.decode(ids, skip_special_tokens=True)
    state, fed, clean = Detokenizer(), [], 0
    for run in runs(ids, cuts):
        state = state.feed(run, decoder)
        fed += run
        full = tok.decode(fed, skip_special_tokens=True)
        assert state.consumed == len(fed)
        if not full.endswith(REPLACEMENT):
            assert state.full_text == state.text == full and state.pending == ""
            # all confirmed: the window keeps, as context, only the ids that came since the previous such point
            kept = [t for t in fed if t not in decoder.skip_ids]
            assert state.read == len(state.window) and list(state.window) == kept[len(kept) - len(state.window):]
            if len(kept) > clean:
                assert len(state.window) <= len(kept) - clean
                clean = len(kept)
        assert final.startswith(state.stable_text()), (fed, state)
        assert state.stable_text(3) == state.stable_text()[: max(0, len(state.stable_text()) - 3)]


# --- stop strings: the old full-decode search is the oracle -------------------

def old_append_tokens(request: Request, token_ids: list[int], decode) -> int:
    """The stop rules before incremental detokenization: decode the whole
    output after every token, search every stop string in it."""
    params, kept = request.params, 0
    for tok in token_ids:
        request.token_ids.append(tok)
        kept += 1
        text = decode(request.output_token_ids)
        for stop in params.stop:
            idx = text.find(stop)
            if idx != -1:
                request.output_text = text[: idx + len(stop) if params.include_stop_str_in_output else idx]
                request.status, request.finish_reason, request.stop_reason = RequestStatus.FINISHED, "stop", stop
                return kept
        if request.num_output_tokens >= params.max_tokens:
            request.status, request.finish_reason = RequestStatus.FINISHED, "length"
            return kept
    return kept


def new_request(params: SamplingParams, prompt=(5, 6, 7)) -> Request:
    return Request("r", None, list(prompt), params, seed=0)


@SETTINGS
@given(data=st.data(), cuts=st.lists(st.integers(1, 6), min_size=1, max_size=8), include=st.booleans())
def test_stop_strings_found_where_the_full_decode_finds_them(case, data, cuts, include):
    """Stop strings cut from the decoded text (so they straddle tokens and
    speculative runs), in random order and with a string that never occurs:
    the same tokens are kept, the same run is truncated at the same token, and
    the text, finish and stop reasons are the same."""
    tok, decoder, ids_strategy = case
    ids = data.draw(ids_strategy)
    text = tok.decode(ids, skip_special_tokens=True)
    stops = ["\x00never"]
    for _ in range(data.draw(st.integers(1, 3))):
        if len(text) >= 1:
            i = data.draw(st.integers(0, len(text) - 1))
            stops.append(text[i: i + data.draw(st.integers(1, 4))])
    stops = data.draw(st.permutations(stops))
    params = SamplingParams(max_tokens=max(1, len(ids)), ignore_eos=True, stop=stops,
                            include_stop_str_in_output=include)
    old, new = new_request(params), new_request(params)
    for run in runs(ids, cuts):
        kept_old = old_append_tokens(old, run, decoder)
        kept_new = append_tokens(new, run, 10**6, decoder)
        assert kept_new == kept_old
        assert (new.token_ids, new.status, new.finish_reason, new.stop_reason, new.output_text) == \
            (old.token_ids, old.status, old.finish_reason, old.stop_reason, old.output_text)
        if old.finished:
            break


# --- transactions: planning works on a copy ----------------------------------

def test_plan_leaves_the_live_detokenizer_alone_and_apply_sets_it(case):
    tok, decoder, _ = case
    ids = tok("Le café 🙂 中文 ok", add_special_tokens=False)["input_ids"]
    req = new_request(SamplingParams(max_tokens=100, stop=["zz"]))
    req.token_ids += ids[:3]
    req.detokenizer = Detokenizer().feed(ids[:3], decoder)
    req.status, req.num_computed_tokens = RequestStatus.RUNNING, req.num_tokens - 1
    before = req.detokenizer
    entry = ScheduledRequest(req, 1)
    p = plan(entry, Outcome(ids[3:]), 10**6, decoder, track_text=True)
    assert req.detokenizer is before and req.num_output_tokens == 3, "planning changed the live request"
    assert p.new.detokenizer.full_text == tok.decode(ids, skip_special_tokens=True)

    calls = []

    def failing(token_ids):
        calls.append(token_ids)
        raise RuntimeError("injected: decode failed")

    with pytest.raises(RuntimeError, match="injected"):
        plan(entry, Outcome(ids[3:]), 10**6, TextDecoder(failing, decoder.skip_ids), track_text=True)
    assert calls and req.detokenizer is before and req.token_ids[3:] == ids[:3]
    apply(p)
    assert req.detokenizer is p.new.detokenizer and req.detokenizer.consumed == len(ids)


# --- the engine: O(1) decoding per token, text survives preemption ------------

@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory, tokenizer_dir):
    return build_model("llama", tmp_path_factory.mktemp("llama512"), tokenizer_dir, max_positions=512)


def engine_for(model_dir, num_blocks=None, max_model_len=None, **sched) -> LLMEngine:
    return LLMEngine(EngineConfig(model=ModelConfig(path=str(model_dir), max_model_len=max_model_len),
                                  cache=CacheConfig(block_size=4, num_blocks=num_blocks),
                                  scheduler=SchedulerConfig(**sched)))


@pytest.mark.usefixtures("one_thread")
def test_decoding_work_per_token_is_constant(long_model_dir, monkeypatch):
    """Stop strings and streaming on, 400 output tokens: fewer than 10 decoded
    tokens per output token (the final full decode included), where decoding
    the whole output after every token decodes 400 * 401 / 2 = 80,200."""
    engine = engine_for(long_model_dir, max_num_batched_tokens=64)
    tok, counts = engine.tokenizer, {"calls": 0, "tokens": 0}
    real = tok.decode

    def counting(token_ids, **kw):
        counts["calls"] += 1
        counts["tokens"] += len(token_ids)
        return real(token_ids, **kw)

    monkeypatch.setattr(tok, "decode", counting)
    n = 400
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, stop=["\x00never", "also never"])
    engine.add_request("long", random_prompts([8], seed=3)[0], params)
    texts = []
    while engine.has_unfinished_requests():
        (out,) = engine.step()
        texts.append(out.outputs[0].text)
    tokens = out.outputs[0].token_ids
    assert len(tokens) == n and out.outputs[0].finish_reason == "length"
    assert texts[-1] == real(tokens, skip_special_tokens=True)
    assert all(texts[-1].startswith(t) for t in texts), "streamed text was taken back"
    assert counts["tokens"] < 10 * n, counts
    assert counts["calls"] < 4 * n, counts


@pytest.mark.usefixtures("one_thread")
def test_incremental_text_survives_preemption(llama_dir):
    """Requests preempted while streaming with stop strings: each keeps its
    incremental text (it counts every output token once) and streams prefixes
    of its final text, which is the full decode."""
    # each request needs up to ceil((14 + 16) / 4) = 8 blocks: 4 of them cannot share 10
    engine = engine_for(llama_dir, num_blocks=10, max_model_len=36, max_num_batched_tokens=16, max_num_seqs=4)
    prompts = random_prompts([9, 12, 7, 14], seed=8)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=["\x00never"])
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, params)
    texts: dict[str, list[str]] = {}
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts.setdefault(out.request_id, []).append(out.outputs[0].text)
            req = engine._requests.get(out.request_id)
            if req is not None and not req.finished:
                assert req.detokenizer.consumed == req.num_output_tokens
            if out.finished:
                finals[out.request_id] = out
    assert sum(o.metrics["num_preemptions"] for o in finals.values()) > 0, "nothing was preempted"
    for rid, out in finals.items():
        final = out.outputs[0].text
        assert final == engine.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)
        assert all(final.startswith(t) for t in texts[rid]), rid
