"""Greedy generation through the graphed forward equals eager generation,
token for token, on the CPU with capture stubbed out (``StubGraph``: each
replay re-runs the captured forward on the refilled static buffers).

Mixed steps throughout: prefill chunks next to decodes and multi-token verify
runs (n-gram, a draft model whose own forwards are graphed too, EAGLE whose
target forwards read every token's hidden state), buckets met below, at and
above, and steps over the largest bucket (patched down to 8) run eagerly.
The torch backend here, and the triton kernels under the interpreter for one
cell. EAGLE's own head forwards are not graphed (proposers/eagle/ runs them).
"""

from __future__ import annotations

import pytest

from arch_zoo import matrix_prompts
from speculant import LLM, SamplingParams
from speculant.model import cuda_graphs
from speculant.model.cuda_graphs import StubGraph
from tiny_eagle import save_random_eagle

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
BASE = dict(block_size=4, max_num_batched_tokens=24, max_num_seqs=5)
SPEC = dict(scorer="mqa", num_speculative_tokens=3)
CELLS = {
    "chunked-no-spec": dict(BASE),
    "ngram-verify": dict(BASE, speculative=dict(SPEC, proposer="ngram")),
    "ngram-over-bucket": dict(BASE, speculative=dict(SPEC, proposer="ngram")),
    "draft-model": dict(BASE, speculative=dict(SPEC, proposer="draft_model")),
    "eagle": dict(BASE, max_num_batched_tokens=16, speculative=dict(SPEC, proposer="eagle")),
}


def stub_resolve(setting, device, backend):
    return "model.cuda_graphs = 'off'" if setting == "off" else (StubGraph, None)


def prompts() -> list[list[int]]:
    return [matrix_prompts()[i] for i in (0, 2, 3, 5, 6)]  # 1, 4, 5, 17 tokens and a repeated pattern


def generate(model_dir, settings: dict, graphs: str) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(model_dir), cuda_graphs=graphs, **settings)
    outs = llm.generate(prompts(), GREEDY, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("cell", list(CELLS))
def test_graphed_greedy_equals_eager_greedy(cell, zoo, tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_graphs, "resolve", stub_resolve)
    if cell == "ngram-over-bucket":
        monkeypatch.setattr(cuda_graphs, "MAX_BUCKET", 8)
    settings = dict(CELLS[cell], attention_backend="torch")
    if "speculative" in settings:
        spec = dict(settings["speculative"])
        if spec["proposer"] == "draft_model":
            spec["proposer_options"] = {"model": str(zoo("llama", draft=True))}
        if spec["proposer"] == "eagle":
            spec["proposer_options"] = {"path": str(save_random_eagle(zoo("llama"), tmp_path / "eagle", 64))}
        settings["speculative"] = spec
    eager_llm, eager = generate(zoo("llama"), settings, "off")
    graphed_llm, graphed = generate(zoo("llama"), settings, "auto")
    assert eager_llm.engine.runner.graphs is None
    assert graphed == eager, f"{cell}: graphed greedy output differs from eager"
    g = graphed_llm.engine.runner.graphs
    assert g is not None and g.replays > 0 and not g.failed
    assert len({bucket for bucket, _ in g.graphs}) >= 3, sorted(g.graphs)
    if cell == "ngram-over-bucket":
        assert g.buckets[-1] == 8 and g.eager_runs > 0, "no step ran over the largest bucket"
    if "speculative" in settings:
        assert graphed_llm.get_metrics()["num_draft_tokens"] > 0, f"{cell}: nothing was proposed"
    if cell == "draft-model":
        draft = graphed_llm.engine.spec.proposer.runner.graphs
        assert draft is not None and draft.replays > 0, "the draft model's forwards were not graphed"


def test_graphed_greedy_on_the_interpreted_triton_kernels(zoo, monkeypatch):
    from triton_interpreter import interpreted_kernels, use_interpreted_kernels

    interpreted_kernels()  # skips without triton
    monkeypatch.setattr(cuda_graphs, "resolve", stub_resolve)
    settings = dict(block_size=4, max_num_batched_tokens=12, max_num_seqs=3, attention_backend="triton",
                    speculative=dict(SPEC, proposer="ngram"))
    with use_interpreted_kernels(cpu_device=True):
        eager_llm, eager = generate(zoo("llama"), settings, "off")
        graphed_llm, graphed = generate(zoo("llama"), settings, "auto")
    assert graphed == eager
    g = graphed_llm.engine.runner.graphs
    assert g is not None and g.replays > 0 and not g.failed
