"""The streaming API: ``LLMEngine.add_request / step / has_unfinished_requests /
abort_request``. Outputs grow monotonically, ``finished`` is set exactly once
(on the last output), and what streams equals what a batch call returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from greedy_compare import check_greedy
from speculant import LLMEngine, SamplingParams
from speculant.config.models import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from tiny_models import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = random_prompts([5, 19, 11], seed=51)  # 19 > budget 8: chunked over three steps
MAX_TOKENS = [10, 12, 6]
REPLACEMENT_CHAR = "\ufffd"  # what decoding an incomplete UTF-8 sequence ends with


@pytest.fixture(scope="module")
def engine(llama_dir) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=ModelConfig(path=str(llama_dir)), cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4)))


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


@dataclass
class Stream:
    """Everything one request streamed, checked as it arrives."""

    request_id: str
    snapshots: list = field(default_factory=list)  # (token_ids, text, finished, finish_reason)

    def take(self, out, tokenizer) -> None:
        assert out.request_id == self.request_id
        tokens, text = list(out.outputs[0].token_ids), out.outputs[0].text
        if self.snapshots:
            prev = self.snapshots[-1]
            assert not prev[2], f"{self.request_id}: output after the finished one"
            assert tokens[: len(prev[0])] == prev[0], f"{self.request_id}: tokens changed, not appended"
            assert len(tokens) - len(prev[0]) <= 1, "more than one token per step without speculation"
        assert out.finished == (out.outputs[0].finish_reason is not None)
        full = tokenizer.decode(tokens, skip_special_tokens=True)
        if out.finished and out.outputs[0].stop_reason is None:
            assert text == full
        elif not out.finished:
            # streamed text holds back only a trailing partial character, or (with stop
            # strings) a tail shorter than the longest stop string
            tail = full[len(text):]
            assert full.startswith(text) and (set(tail) <= {"\ufffd"} or len(tail.rstrip("\ufffd")) < 8)
        self.snapshots.append((tokens, text, out.finished, out.outputs[0].finish_reason))

    @property
    def final(self):
        assert self.snapshots and self.snapshots[-1][2], f"{self.request_id} never finished"
        return self.snapshots[-1]


def drain(engine: LLMEngine, streams: dict[str, Stream], max_steps: int = 500) -> int:
    steps = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        ids = [o.request_id for o in outs]
        assert len(ids) == len(set(ids)), "a request appeared twice in one step"
        for out in outs:
            streams[out.request_id].take(out, engine.tokenizer)
        steps += 1
        assert steps < max_steps, "engine does not finish"
    return steps


def test_step_with_nothing_to_do(engine):
    assert not engine.has_unfinished_requests()
    assert engine.step() == []


def test_outputs_grow_monotonically_and_finish_once(engine, hf_reference):
    ids = [engine.add_request(f"s{i}", p, greedy(m)) for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS))]
    assert ids == ["s0", "s1", "s2"] and engine.has_unfinished_requests()
    streams = {i: Stream(i) for i in ids}
    drain(engine, streams)
    ref = hf_reference("llama")
    for rid, prompt, m in zip(ids, PROMPTS, MAX_TOKENS):
        tokens, text, finished, reason = streams[rid].final
        assert reason == "length" and len(tokens) == m
        check_greedy(tokens, ref.greedy(prompt, m), rid)
        # one output per step from the first scheduled step on, the last one finished
        assert sum(s[2] for s in streams[rid].snapshots) == 1
    # the chunked prompt streamed empty, unfinished outputs while it prefilled
    long_stream = streams["s1"].snapshots
    assert long_stream[0][0] == [] and not long_stream[0][2]
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_stream_equals_a_batch_generate(engine, llama_dir):
    from speculant import LLM

    streams = {}
    for p, m in zip(PROMPTS, MAX_TOKENS):
        rid = engine.add_request(None, p, greedy(m))
        streams[rid] = Stream(rid)
    drain(engine, streams)
    llm = LLM(str(llama_dir), block_size=4, max_num_batched_tokens=8, max_num_seqs=4)
    batch = llm.generate(PROMPTS, [greedy(m) for m in MAX_TOKENS], use_tqdm=False)
    assert [s.final[0] for s in streams.values()] == [o.outputs[0].token_ids for o in batch]
    assert [s.final[1] for s in streams.values()] == [o.outputs[0].text for o in batch]


def test_request_added_mid_stream(engine, hf_reference):
    streams = {"first": Stream("first"), "late": Stream("late")}
    engine.add_request("first", PROMPTS[0], greedy(12))
    for _ in range(4):
        for out in engine.step():
            streams[out.request_id].take(out, engine.tokenizer)
    engine.add_request("late", PROMPTS[1], greedy(8))
    drain(engine, streams)
    ref = hf_reference("llama")
    check_greedy(streams["first"].final[0], ref.greedy(PROMPTS[0], 12), "first")
    check_greedy(streams["late"].final[0], ref.greedy(PROMPTS[1], 8), "late")


def test_abort_mid_stream(engine, hf_reference):
    streams = {"keep": Stream("keep"), "drop": Stream("drop")}
    engine.add_request("keep", PROMPTS[0], greedy(10))
    engine.add_request("drop", PROMPTS[2], greedy(10))
    for _ in range(5):
        for out in engine.step():
            streams[out.request_id].take(out, engine.tokenizer)
    assert 0 < len(streams["drop"].snapshots[-1][0]) < 10, "abort should hit a running, decoding request"
    assert engine.abort_request("drop") is True
    assert engine.abort_request("drop") is False
    assert engine.has_unfinished_requests()
    before = len(streams["drop"].snapshots)
    drain(engine, streams)
    assert len(streams["drop"].snapshots) == before, "an aborted request kept streaming"
    check_greedy(streams["keep"].final[0], hf_reference("llama").greedy(PROMPTS[0], 10), "keep")
    assert engine.abort_request("keep") is False, "aborting a finished request"
    blocks = engine.blocks
    assert blocks.num_free_blocks == blocks.num_blocks


def test_abort_everything_leaves_nothing_unfinished(engine):
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"x{i}", p, greedy(20))
    engine.step()
    for i in range(len(PROMPTS)):
        assert engine.abort_request(f"x{i}")
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_finished_request_id_can_be_reused(engine):
    streams = {"again": Stream("again")}
    engine.add_request("again", PROMPTS[0], greedy(3))
    drain(engine, streams)
    first = streams["again"].final[0]
    streams = {"again": Stream("again")}
    engine.add_request("again", PROMPTS[0], greedy(3))
    drain(engine, streams)
    assert streams["again"].final[0] == first


def _stream_texts(engine, prompt, params) -> list[str]:
    streams = {"t": Stream("t")}
    engine.add_request("t", prompt, params)
    drain(engine, streams)
    return [snap[1] for snap in streams["t"].snapshots]


def _taken_back(texts: list[str], ignore_trailing: str = "") -> list[str]:
    """Streamed texts that are not a prefix of the final text."""
    return [t for t in texts if not texts[-1].startswith(t.rstrip(ignore_trailing))]


def test_streamed_text_grows_apart_from_incomplete_characters(engine):
    """Without stop strings, each streamed text (less a trailing U+FFFD) is a
    prefix of the final text."""
    texts = _stream_texts(engine, PROMPTS[0], greedy(24))
    assert len(texts) == 24 and not _taken_back(texts, ignore_trailing=REPLACEMENT_CHAR)


def test_streamed_text_is_never_taken_back(engine):
    texts = _stream_texts(engine, PROMPTS[0], greedy(24))
    assert not _taken_back(texts), f"streamed then taken back: {_taken_back(texts)}"


def test_streamed_text_never_shows_part_of_a_stop_string(engine):
    streams = {"ref": Stream("ref")}
    engine.add_request("ref", PROMPTS[0], greedy(24))
    drain(engine, streams)
    tokens, plain = streams["ref"].final[:2]
    # a 2-letter stop string whose first letter ends one token and whose second starts the next
    ends = {len(engine.tokenizer.decode(tokens[: i + 1], skip_special_tokens=True)) for i in range(len(tokens))}
    stop = next(plain[i: i + 2] for i in range(2, len(plain) - 1)
                if plain[i: i + 2].isascii() and plain[i: i + 2].isalpha() and plain.find(plain[i: i + 2]) == i
                and i + 1 in ends)
    texts = _stream_texts(engine, PROMPTS[0], greedy(24, stop=[stop]))
    assert stop not in texts[-1]
    taken_back = _taken_back(texts, ignore_trailing=REPLACEMENT_CHAR)  # U+FFFD is the other bug
    assert not taken_back, f"stop {stop!r}: streamed then taken back: {taken_back}"
