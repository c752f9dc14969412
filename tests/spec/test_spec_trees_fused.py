"""Token trees on the fused C decoder (bf16 weights, and a tiny GGUF kept in its
blocks): greedy output equals no speculation, with hypothesis drawing tree shapes
around the reference continuation (a node continues it with probability ``hit``,
else a random token distinct from its siblings), so accepted paths leave the
first child and their K/V moves. Every forward runs fused, with tree masks."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_marks import needs_bf16_paths

from speculant import LLM, SamplingParams
from speculant.interfaces import Proposals, Proposer

pytestmark = [pytest.mark.usefixtures("one_thread"), needs_bf16_paths]  # the fused layers need them

WIDTH, NODES, DEPTH = 4, 12, 6  # the engine's ceilings; each example draws its trees within them
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 9, 10, 5, 6], [40, 41, 42, 43, 44], list(range(100, 123))]


def engine(path, trees: bool) -> LLM:
    spec = {"proposer": "ngram", "num_speculative_tokens": DEPTH, "tree_width": WIDTH, "max_tree_tokens": NODES,
            "draft_length": {"policy": "fixed"}} if trees else {}
    return LLM(str(path), dtype="bfloat16", fast_forward="on", block_size=4, max_num_batched_tokens=64,
               max_num_seqs=4, max_model_len=96, speculative=spec)


@pytest.fixture(scope="module", params=["llama", "llama-gguf"])
def fused_pair(request, zoo, tmp_path_factory, tokenizer_dir):
    """(engine with trees, reference outputs without speculation) on one fused model."""
    from tiny_gguf import write_tiny_gguf

    path = (write_tiny_gguf(tmp_path_factory.mktemp("g") / "tiny.gguf", tokenizer_dir, hidden=256)
            if request.param == "llama-gguf" else zoo("llama"))
    plain = engine(path, trees=False)
    assert plain.engine.runner.fast_forward.decoder.fused is not None, \
        plain.engine.runner.fast_forward.decoder.fused_reason
    reference = {tuple(p): o.outputs[0].token_ids for p, o in zip(PROMPTS, plain.generate(PROMPTS, GREEDY,
                                                                                           use_tqdm=False))}
    return engine(path, trees=True), reference


class AroundReference(Proposer):
    """Random trees in which a node continues the reference with probability ``hit``."""

    def __init__(self, real: Proposer, reference: dict, seed: int, width: int, nodes: int, depth: int,
                 hit: float) -> None:
        self.context, self.options, self.capabilities = real.context, real.options, real.capabilities
        self.reference, self.rng = reference, random.Random(seed)
        self.width, self.nodes, self.depth, self.hit = width, nodes, depth, hit
        self.vocab = real.context.target.vocab_size

    def propose(self, batch) -> Proposals:
        rows, parents = [], []
        for d in batch.decodes:
            req = d.request
            truth = self.reference[tuple(req.prompt_token_ids)][len(req.output_token_ids):]
            toks, par = self.tree(truth, min(d.num_spec_tokens, self.nodes))
            rows.append(toks)
            parents += par
        out = Proposals.from_lists(rows)
        return Proposals(out.token_ids, out.cu_num_draft_tokens, parents=torch.tensor(parents, dtype=torch.long))

    def tree(self, truth: list[int], budget: int) -> tuple[list[int], list[int]]:
        rng = self.rng
        toks: list[int] = []
        par: list[int] = []
        depth = {-1: 0}
        kids: dict[int, list[int]] = {-1: []}
        on_truth = {-1}  # nodes whose path so far is the reference's
        for _ in range(budget):
            open_ = [n for n in kids if len(kids[n]) < self.width and depth[n] < min(self.depth, len(truth))]
            if not open_:
                break
            p = rng.choice(open_)
            taken = {toks[k] for k in kids[p]}
            want = truth[depth[p]]
            if p in on_truth and want not in taken and rng.random() < self.hit:
                tok = want
            else:
                tok = rng.choice([t for t in range(self.vocab) if t not in taken and t != want])
            j = len(toks)
            toks.append(tok)
            par.append(p)
            kids[p].append(j)
            kids[j], depth[j] = [], depth[p] + 1
            if p in on_truth and tok == want:
                on_truth.add(j)
        return toks, par

    def commit(self, batch, num_accepted, scores) -> None:
        pass

    def free(self, request_id: str) -> None:
        pass


class MaskSpy:
    """Counts fused runs, and those that carried a tree mask."""

    def __init__(self, fused) -> None:
        self.fused, self.calls, self.tree_calls = fused, 0, 0

    def __enter__(self):
        run = self.fused.run

        def spied(hidden, cos, sin, metadata, *caches):
            self.calls += 1
            self.tree_calls += metadata.pieces.mask_pointers()[0] is not None
            return run(hidden, cos, sin, metadata, *caches)

        self.fused.run = spied
        return self

    def __exit__(self, *exc) -> None:
        del self.fused.run


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), width=st.integers(1, WIDTH), nodes=st.integers(1, NODES),
       depth=st.integers(1, DEPTH), hit=st.sampled_from([0.3, 0.6, 0.9]))
def test_greedy_trees_on_the_fused_decoder_equal_no_speculation(fused_pair, seed, width, nodes, depth, hit):
    llm, reference = fused_pair
    eng = llm.engine
    real = eng.spec.proposer
    eng.spec.proposer = AroundReference(real, reference, seed, width, nodes, depth, hit)
    before = llm.get_metrics()
    try:
        with MaskSpy(eng.runner.fast_forward.decoder.fused) as spy:
            outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        eng.spec.proposer = real
    assert [o.outputs[0].token_ids for o in outs] == [reference[tuple(p)] for p in PROMPTS]
    after = llm.get_metrics()
    assert after["num_accepted_tokens"] > before["num_accepted_tokens"]
    assert spy.calls > 0 and (spy.tree_calls > 0 or width == 1 or nodes == 1), (spy.calls, spy.tree_calls)
