"""A plugin that hands the target runner a span outside the KV pool gets a clear error,
the process lives, and the other requests' output is what it would have been.

The proposer below wraps the real n-gram proposer, builds a runner of its own
through the plugin API (``ProposerContext.target.new_runner``, a
``RunnerView``) and, before each proposal, calls its ``forward`` with a span
whose prefix block lies outside the pool (one past its end, 100000, negative). Before the bounds checks, the C
attention read such a block: garbage (NaN) or SIGSEGV. Now the forward raises
``IndexError`` naming the block and the pool, the engine's proposer guard
turns that into lost speculation for the step, and every request still equals
the engine without speculation, token for token. With the Python check
switched off the C kernels refuse on their own, before touching memory.
"""

from __future__ import annotations

import pytest
from kernel_marks import require_kernel

from conftest import GREEDY, assert_idle, make_llm
from speculant.config.models import ModelConfig
from speculant.interfaces import Proposals, Proposer, QuerySpan
from speculant.model import runner as runner_module
from tiny_models import random_prompts

PROMPTS = random_prompts([6, 9, 13, 17, 20, 8], seed=11)
BLOCKS = ("one past the pool", 100000, -3)


class OutOfPoolProposer(Proposer):
    name = "out_of_pool"
    api_version = "2.0"

    def __init__(self, real: Proposer, model_dir, dtype: str) -> None:
        self.real, self.context, self.options, self.capabilities = real, real.context, real.options, real.capabilities
        target = self.context.target
        self.runner = target.new_runner(ModelConfig(path=str(model_dir), dtype=dtype, attention_backend="cpu_kernel",
                                                    max_model_len=target.max_model_len))
        self.errors: list[BaseException] = []
        self.calls = 0

    def propose(self, batch) -> Proposals:
        pool = self.runner.block_manager.num_blocks + 1  # + the trash block
        block = BLOCKS[self.calls % len(BLOCKS)]
        block = pool if block == "one past the pool" else block
        self.calls += 1
        span = QuerySpan([block, pool - 1], self.runner.block_manager.block_size, [3], [0])  # its query: the trash
        try:
            self.runner.forward([span])
        except Exception as exc:
            self.errors.append(exc)
            raise
        raise AssertionError(f"a forward reading block {block} of a {pool}-block pool did not raise")

    def commit(self, batch, num_accepted, scores) -> None:
        self.real.commit(batch, num_accepted, scores)

    def free(self, request_id: str) -> None:
        self.real.free(request_id)

    def restore_prefix(self, request, num_cached_tokens: int) -> int:
        return self.real.restore_prefix(request, num_cached_tokens)


def _run(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("python_check", [True, False], ids=["python-check", "c-check-alone"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_span_outside_the_pool_costs_only_speculation(python_check, dtype, llama_dir, monkeypatch):
    if not python_check:
        require_kernel()
        monkeypatch.setattr(runner_module, "check_spans", lambda *args: None)
    kw = dict(dtype=dtype, attention_backend="cpu_kernel")
    expected = _run(make_llm(llama_dir, None, **kw))
    llm = make_llm(llama_dir, "ngram", **kw)
    faulty = OutOfPoolProposer(llm.engine.spec.proposer, llama_dir, dtype)
    llm.engine.spec.proposer = faulty
    assert _run(llm) == expected
    pool = faulty.runner.num_blocks + 1
    assert faulty.calls >= 3 and len(faulty.errors) == faulty.calls
    for err in faulty.errors:
        assert isinstance(err, IndexError), repr(err)
        assert f"outside the KV pool of {pool} blocks" in str(err) and "nothing was read or written" in str(err)
    assert {int(str(e).split(" is block ")[1].split(",")[0]) for e in faulty.errors} == {pool, 100000, -3}
    assert llm.get_metrics()["proposer_errors"] >= faulty.calls
    llm.engine.spec.proposer = faulty.real  # the engine serves on, with speculation
    assert _run(llm) == expected
    assert_idle(llm)
    good = faulty.runner.forward([QuerySpan([0], 0, [1, 2, 3], [2])])  # the plugin's runner works on
    assert good.logits.isfinite().all()
