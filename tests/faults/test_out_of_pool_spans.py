"""A plugin that names KV it does not own gets a clear error, nothing is read or
written, the process lives, and the other requests' output is what it would have been.

The proposer below wraps the real n-gram proposer, builds a runner of its own
through the plugin API (``ProposerContext.target.new_runner``, a
``RunnerView``) and, before each proposal, calls its ``forward`` with a span
naming KV that is not its own: a request's sequence on the target (from the
step's batch), another plugin's sequence, a sequence it freed, the parent of
a fork it freed, a copy of a live handle made by hand, and a raw block table
reaching outside the pool (what API 2 accepted, and a C attention read as
garbage or SIGSEGV before the bounds checks). Each is a ``SequenceHandleError``
naming the handle and the fix, raised before the runner touches the cache;
the engine's proposer guard turns it into lost speculation for the step, and
every request still equals the engine without speculation, token for token.
(The block-table bounds themselves, Python and C, are tested in
tests/model/attention/test_span_bounds.py.)
"""

from __future__ import annotations

import pytest
import torch

from conftest import GREEDY, assert_idle, make_llm
from faulty_proposer import Delegating
from speculant.config.models import ModelConfig
from speculant.interfaces import Proposals, Proposer, QuerySpan, SequenceHandle, SequenceHandleError
from tiny_models import random_prompts

PROMPTS = random_prompts([6, 9, 13, 17, 20, 8], seed=11)
FAULTS = {
    "target request": "issued by another runner view",
    "another plugin": "issued by another runner view",
    "freed": "which was freed",
    "forked, parent freed": "which was freed",
    "copied by hand": "which this view never issued",
    "block table": "is not a SequenceHandle",
}


class OwnershipProposer(Delegating):
    name = "not_mine"

    def __init__(self, real: Proposer, model_dir, dtype: str) -> None:
        super().__init__(real)
        target = self.context.target
        cfg = ModelConfig(path=str(model_dir), dtype=dtype, attention_backend="cpu_kernel",
                          max_model_len=target.max_model_len)
        self.runner = target.new_runner(cfg)
        self.other = target.new_runner(cfg)  # stands for another plugin's runner
        self.errors: list[tuple[str, BaseException]] = []
        self.calls = 0

    def _foreign(self, kind: str, batch):
        """A span over KV this plugin must not reach (its own live sequence stays valid)."""
        if kind == "target request":
            return QuerySpan(batch.entries[0].sequence, 0, [3], [0])
        if kind == "another plugin":
            theirs, _ = self.other.open_sequence("theirs")
            self.other.grow(theirs, 4)
            return QuerySpan(theirs, 0, [3], [0])
        if kind == "freed":
            gone, _ = self.runner.open_sequence("gone")
            self.runner.grow(gone, 4)
            self.runner.free(gone)
            return QuerySpan(gone, 0, [3], [0])
        if kind == "forked, parent freed":
            parent, _ = self.runner.open_sequence("parent")
            self.runner.grow(parent, 4)
            self.runner.forward([QuerySpan(parent, 0, [3, 4], [1])])
            child = self.runner.fork(parent, 2, label="child")
            self.runner.free(parent)
            self.runner.grow(child, 3)
            assert self.runner.forward([QuerySpan(child, 2, [5], [0])]).logits.isfinite().all()  # the child lives
            self.runner.free(child)
            return QuerySpan(parent, 2, [5], [0])
        live, _ = self.runner.open_sequence("live")
        self.runner.grow(live, 4)
        if kind == "copied by hand":
            return QuerySpan(SequenceHandle(live.view, live.serial, live.label), 0, [3], [0])
        return QuerySpan([100000, self.runner.num_blocks], 0, [3], [0])  # type: ignore[arg-type]

    def propose(self, batch) -> Proposals:
        kind = list(FAULTS)[self.calls % len(FAULTS)]
        self.calls += 1
        span = self._foreign(kind, batch)
        before = [c.clone() for c in self.runner._runner.key_caches]
        try:
            self.runner.forward([span])
        except Exception as exc:
            self.errors.append((kind, exc))
            assert all(torch.equal(a, b) for a, b in zip(before, self.runner._runner.key_caches)), \
                f"the refused {kind} span wrote K/V"
            raise
        raise AssertionError(f"a forward over a {kind} sequence did not raise")


def _run(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_a_plugin_does_not_own_costs_only_speculation(dtype, llama_dir):
    kw = dict(dtype=dtype, attention_backend="cpu_kernel")
    expected = _run(make_llm(llama_dir, None, **kw))
    llm = make_llm(llama_dir, "ngram", **kw)
    faulty = OwnershipProposer(llm.engine.spec.proposer, llama_dir, dtype)
    llm.engine.spec.proposer = faulty
    assert _run(llm) == expected
    assert faulty.calls >= len(FAULTS) and len(faulty.errors) == faulty.calls
    for kind, err in faulty.errors:
        assert isinstance(err, SequenceHandleError), (kind, repr(err))
        assert FAULTS[kind] in str(err), (kind, str(err))
        assert str(err).startswith("span 0 of the forward names ")
        assert "nothing was read or written" in str(err)
    assert {kind for kind, _ in faulty.errors} == set(FAULTS)
    assert llm.get_metrics()["proposer_errors"] >= faulty.calls
    llm.engine.spec.proposer = faulty.real  # the engine serves on, with speculation
    assert _run(llm) == expected
    assert_idle(llm)
    mine, _ = faulty.runner.open_sequence("mine")  # the plugin's runner works on, on its own sequences
    faulty.runner.grow(mine, 3)
    assert faulty.runner.forward([QuerySpan(mine, 0, [1, 2, 3], [2])]).logits.isfinite().all()
