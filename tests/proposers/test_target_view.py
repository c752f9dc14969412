"""A proposer sees the target through a ``TargetView``: the fields it needs,
the target's own LM head, final norm and token embedding, and a factory for its own runner on
the target's backend and KV geometry; nothing else."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speculant import LLMEngine
from speculant.config.compat import build_config
from speculant.config.models import ModelConfig
from speculant.interfaces import QuerySpan, SamplingParams, SequenceHandle, SequenceHandleError, TargetView

FIELDS = {"tokenizer", "vocab_size", "device", "dtype", "max_model_len", "block_size", "num_blocks",
          "output_embedding", "final_norm", "input_embedding", "new_runner"}


@pytest.fixture(scope="module")
def engine(llama_dir):
    return LLMEngine(build_config({"model": {"path": str(llama_dir)}, "cache": {"num_blocks": 64, "block_size": 8},
                                   "speculative": {"proposer": "ngram"}}))


def test_the_view_holds_what_proposers_need_and_nothing_else(engine):
    view = engine.spec.proposer.context.target
    assert isinstance(view, TargetView)
    assert {f.name for f in dataclasses.fields(TargetView)} == FIELDS
    runner = engine.runner
    assert (view.vocab_size, view.device, view.dtype, view.max_model_len, view.block_size, view.num_blocks) == \
        (runner.vocab_size, runner.device, runner.model.dtype, runner.max_model_len, 8, 64)
    assert view.tokenizer is runner.tokenizer
    assert view.output_embedding is runner.model.get_output_embeddings()
    assert view.final_norm is runner.model.base_model.norm
    assert view.input_embedding is runner.model.get_input_embeddings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.vocab_size = 1  # type: ignore[misc]


def test_output_embedding_maps_hidden_states_to_the_targets_logits(engine):
    view, runner = engine.spec.proposer.context.target, engine.view
    seq, cached = runner.open_sequence("probe")
    assert cached == 0
    runner.grow(seq, 4)
    out = runner.forward([QuerySpan(seq, 0, [5, 6, 7, 8], [3])], want_hidden=True)
    runner.free(seq)
    with torch.inference_mode():
        assert torch.allclose(view.output_embedding(out.hidden_states).float(), out.logits, atol=1e-5)


def test_new_runner_shares_the_targets_backend_and_kv_geometry(engine, llama_dir):
    view = engine.spec.proposer.context.target
    runner = view.new_runner(ModelConfig(path=str(llama_dir)), option="speculative.proposer_options.model")
    assert runner._runner.backend is engine.runner.backend
    assert (runner.block_size, runner.num_blocks) == (8, 64)
    assert runner._blocks is not engine.blocks
    assert not hasattr(runner, "block_manager") and not hasattr(runner, "key_caches")  # KV only by handle


# --- sequence handles: a plugin attends only to its own sequences ----------------------------------
@pytest.fixture(scope="module")
def own_runner(engine, llama_dir):
    return engine.spec.proposer.context.target.new_runner(ModelConfig(path=str(llama_dir)))


def _last_logits(runner, seq, tokens, start=0):
    runner.grow(seq, start + len(tokens))
    return runner.forward([QuerySpan(seq, start, tokens, [len(tokens) - 1])]).logits[0]


def _refused(runner, span_or_call, match):
    before = [c.clone() for c in runner._runner.key_caches]
    with pytest.raises(SequenceHandleError, match=match):
        span_or_call() if callable(span_or_call) else runner.forward([span_or_call])
    assert all(torch.equal(a, b) for a, b in zip(before, runner._runner.key_caches)), "a refused call wrote K/V"


def test_a_sequence_grows_and_attends_to_its_own_prefix(own_runner):
    whole, _ = own_runner.open_sequence("whole")
    split, _ = own_runner.open_sequence("split")
    expected = _last_logits(own_runner, whole, [3, 4, 5, 6, 7, 8, 9, 10, 11, 12])  # crosses a block of 8
    _last_logits(own_runner, split, [3, 4, 5, 6, 7])
    assert torch.allclose(_last_logits(own_runner, split, [8, 9, 10, 11, 12], start=5), expected, atol=1e-5)
    for seq in (whole, split):
        own_runner.free(seq)


def test_a_span_past_the_sequences_slots_is_refused(own_runner):
    seq, _ = own_runner.open_sequence("short")
    own_runner.grow(seq, 4)
    with pytest.raises(IndexError, match=r"writes positions 2\.\.9 of <sequence #\d+ 'short' of runner view "
                                         r"'proposer-\d+'>, which has KV slots for positions 0\.\.7; call "
                                         r"runner\.grow\(handle, 10\) first"):
        own_runner.forward([QuerySpan(seq, 2, list(range(8)), [0])])
    own_runner.free(seq)


def test_another_views_handle_is_refused(engine, own_runner, llama_dir):
    other = engine.spec.proposer.context.target.new_runner(ModelConfig(path=str(llama_dir)))  # another plugin's
    theirs, _ = other.open_sequence("theirs")
    other.grow(theirs, 4)
    _refused(own_runner, QuerySpan(theirs, 0, [1, 2, 3], [2]),
             r"span 0 of the forward names <sequence #0 'theirs' of runner view 'proposer-\d+'>, issued by another "
             r"runner view; this view is 'proposer-\d+' and holds only its own sequences")
    _refused(own_runner, lambda: own_runner.free(theirs), "issued by another runner view")
    other.free(theirs)


def test_the_targets_request_sequences_are_refused_outside_their_step(engine, own_runner):
    """A scorer's handles (ScheduledRequest.sequence) live for their step, on the target's view only."""
    seen = []

    class Spy:  # records each step's handles from the batch the engine hands its proposer
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def propose(self, batch):
            seen.extend(e.sequence for e in batch.entries)
            return self.real.propose(batch)

    real = engine.spec.proposer
    engine.spec.proposer = Spy(real)
    try:
        engine.add_request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=3, temperature=0.0))
        engine.add_request("b", [6, 7, 8], SamplingParams(max_tokens=3, temperature=0.0))
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.spec.proposer = real
    assert seen and all(isinstance(h, SequenceHandle) for h in seen)
    assert {h.label for h in seen} == {"a", "b"} and len({h.serial for h in seen}) == len(seen)
    request_a = seen[0]
    _refused(own_runner, QuerySpan(request_a, 0, [1], [0]), "issued by another runner view")  # a proposer's runner
    _refused(engine.view, QuerySpan(request_a, 0, [1], [0]),  # the target, after the step
             r"names <sequence #\d+ 'a' of runner view 'target-\d+'>, which was freed \(or belonged to a step "
             "that has ended")


def test_freed_and_forged_handles_are_refused(own_runner):
    seq, _ = own_runner.open_sequence("gone")
    own_runner.grow(seq, 4)
    own_runner.free(seq)
    _refused(own_runner, QuerySpan(seq, 0, [1, 2], [1]), r"'gone' of runner view 'proposer-\d+'>, which was freed")
    _refused(own_runner, lambda: own_runner.grow(seq, 8), "which was freed")
    live, _ = own_runner.open_sequence("live")
    own_runner.grow(live, 4)
    copy = SequenceHandle(live.view, live.serial, live.label)  # same fields, not the handle
    _refused(own_runner, QuerySpan(copy, 0, [1, 2], [1]), "which this view never issued")
    made_up = SequenceHandle(own_runner.name, 10**6)
    _refused(own_runner, QuerySpan(made_up, 0, [1, 2], [1]), "which this view never issued")
    _refused(own_runner, QuerySpan([0, 1], 0, [1, 2], [1]), "is not a SequenceHandle")  # a raw block table
    own_runner.free(live)


def test_fork_shares_the_prefix_and_copies_on_write(own_runner):
    blocks = own_runner._blocks
    free_before = blocks.num_free_blocks
    parent, _ = own_runner.open_sequence("parent")
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]  # 11 tokens: one full block of 8 and a partial one
    _last_logits(own_runner, parent, prompt)
    child = own_runner.fork(parent, len(prompt), label="child")
    assert blocks.block_table(own_runner._live[child.serial][1]) == blocks.block_table(
        own_runner._live[parent.serial][1])  # shared, nothing copied yet
    # both continue differently from the same prefix: the partial block is copied before either writes
    child_next = _last_logits(own_runner, child, [20, 21], start=len(prompt))
    parent_next = _last_logits(own_runner, parent, [30, 31], start=len(prompt))
    ref, _ = own_runner.open_sequence("reference")
    assert torch.allclose(_last_logits(own_runner, ref, prompt + [20, 21]), child_next, atol=1e-5)
    own_runner.free(ref)
    own_runner.free(parent)  # the parent first: the child keeps the prefix
    _refused(own_runner, QuerySpan(parent, 0, [1], [0]), "which was freed")
    ref, _ = own_runner.open_sequence("reference")
    assert torch.allclose(_last_logits(own_runner, child, [22], start=len(prompt) + 2),
                          _last_logits(own_runner, ref, prompt + [20, 21, 22]), atol=1e-5)
    assert not torch.allclose(parent_next, child_next)
    own_runner.free(ref)
    own_runner.free(child)
    assert blocks.num_free_blocks == free_before
    blocks.check()
