"""EAGLE token trees end to end (``proposers.eagle.tree_draft``): greedy output
equals the engine without speculation over tree shapes, with and without a
draft vocabulary; the tree path at width 1 is today's chain token for token;
and the head's cache follows the accepted path: the target's hidden states it
is fed at each position are the ones a chain run feeds it, also where the
accepted path left the first child.

The target is the 16-token tiny llama of ``test_spec_trees.py``; the heads are
untrained (``tests/tiny_eagle.py``), so acceptance comes from the tree's
breadth, and branches past the first child are accepted often.
"""

from __future__ import annotations

import pytest
import torch

from spec_helpers import run, token_ids
from speculant import LLM, SamplingParams
from speculant.proposers.eagle import proposer as eagle_proposer
from tiny_eagle import save_random_eagle
from tiny_models import build_model

V = 16
PROMPTS = [torch.randint(V, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 9, 17, 30)]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def v16(tmp_path_factory, tokenizer_dir):
    return build_model("llama", tmp_path_factory.mktemp("v16_eagle_trees"), tokenizer_dir, vocab_size=V, seed=7)


@pytest.fixture(scope="module")
def heads(v16, tmp_path_factory):
    """{draft vocabulary size or None: a random EAGLE head for ``v16``}."""
    return {size: save_random_eagle(v16, tmp_path_factory.mktemp(f"eagle_{size}"), size, seed=3)
            for size in (None, 8)}


@pytest.fixture(scope="module")
def plain(v16):
    return token_ids(run(llm(v16), PROMPTS, GREEDY))


def llm(model_dir, **spec) -> LLM:
    return LLM(model=str(model_dir), block_size=4, num_blocks=256, max_num_batched_tokens=64, max_num_seqs=4,
               speculative=spec)


def eagle(v16, head, depth: int, **trees) -> LLM:
    return llm(v16, proposer="eagle", proposer_options={"path": str(head)}, num_speculative_tokens=depth,
               draft_length={"policy": "fixed"}, **trees)


def record_paths(engine: LLM) -> list[list[int]]:
    """Every accepted path the proposer is told of, appended as steps run."""
    paths: list[list[int]] = []
    commit = engine.engine.guard.commit

    def recorded(proposer, batch, accepted, scores):
        paths.extend(accepted.nodes)
        return commit(proposer, batch, accepted, scores)

    engine.engine.guard.commit = recorded
    return paths


@pytest.mark.parametrize("vocab", [None, 8], ids=["full-vocab", "draft-vocab"])
@pytest.mark.parametrize("width, nodes, depth", [(2, 4, 2), (2, 8, 4), (3, 8, 3), (4, 16, 6)])
def test_greedy_eagle_trees_equal_no_speculation(v16, heads, plain, vocab, width, nodes, depth):
    engine = eagle(v16, heads[vocab], depth, tree_width=width, max_tree_tokens=nodes)
    paths = record_paths(engine)
    assert token_ids(run(engine, PROMPTS, GREEDY)) == plain
    m = engine.get_metrics()
    assert m["num_accepted_tokens"] > 0 and m["num_draft_tokens"] > m["num_steps"], m
    assert max(len(p) for p in paths) >= 2, "no step accepted two levels of a tree"
    assert any(p != list(range(len(p))) for p in paths), "no step accepted a branch past the first child"


def test_the_tree_path_at_width_one_is_the_chain(v16, heads, monkeypatch):
    """The tree drafting code at width 1 (masks, positions, node commits) drafts and
    accepts what the chain drafting does, token for token."""
    chain = eagle(v16, heads[8], 4)
    tree = eagle(v16, heads[8], 4, tree_width=2, max_tree_tokens=4)
    real = eagle_proposer.draft_trees
    widths: list[int] = []

    def one_wide(head, embed, logits, vocab, trees, feats, width, depth):
        widths.append(width)
        return real(head, embed, logits, vocab, trees, feats, 1, depth)

    monkeypatch.setattr(eagle_proposer, "draft_trees", one_wide)
    assert token_ids(run(tree, PROMPTS, GREEDY)) == token_ids(run(chain, PROMPTS, GREEDY))
    assert widths and set(widths) == {2}, "the tree engine did not draft through the tree path"
    a, b = chain.get_metrics(), tree.get_metrics()
    for key in ("num_draft_tokens", "num_accepted_tokens", "num_steps"):
        assert a[key] == b[key], (key, a[key], b[key])


def fed_hidden(engine: LLM) -> dict[tuple[int, int], torch.Tensor]:
    """{(prompt index, position): the target hidden state the head is fed there}, recorded at commit."""
    proposer = engine.engine.spec.proposer
    add = proposer._add
    fed: dict[tuple[int, int], torch.Tensor] = {}
    order: dict[str, int] = {}

    def recorded(request_id, start, hidden, token_ids):
        index = order.setdefault(request_id, len(order))
        for j in range(hidden.shape[0]):
            fed[index, start + j] = hidden[j].clone()
        return add(request_id, start, hidden, token_ids)

    proposer._add = recorded
    return fed


def test_the_head_is_fed_the_accepted_path(v16, heads, plain):
    """A tree run feeds the head, at every position, the hidden state a chain run feeds it:
    the accepted path's rows of the tree verify, not the rows that follow the root's."""
    chain, tree = eagle(v16, heads[None], 3), eagle(v16, heads[None], 3, tree_width=3, max_tree_tokens=8)
    chain_fed, tree_fed = fed_hidden(chain), fed_hidden(tree)
    paths = record_paths(tree)
    solo = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)]
    for prompt, want in zip(PROMPTS, plain):  # one request at a time: the indices name the prompt
        assert token_ids(run(chain, [prompt], solo)) == [want]
        assert token_ids(run(tree, [prompt], solo)) == [want]
    assert any(p != list(range(len(p))) for p in paths), "no branch past the first child was accepted"
    shared = sorted(set(chain_fed) & set(tree_fed))
    assert len(shared) > 100
    for key in shared:
        torch.testing.assert_close(tree_fed[key], chain_fed[key], rtol=1e-4, atol=1e-5, msg=f"position {key}")


def test_bf16_trees_from_a_draft_vocabulary_with_distributions(v16, heads):
    """A batch that needs the head's distributions (a sampling request, a greedy one asking
    for log-probabilities) drafts bfloat16 trees from a draft vocabulary without a fault."""
    engine = LLM(model=str(v16), dtype="bfloat16", block_size=4, num_blocks=256, max_num_batched_tokens=64,
                 max_num_seqs=4, speculative={"proposer": "eagle", "proposer_options": {"path": str(heads[8])},
                                              "num_speculative_tokens": 3, "tree_width": 2, "max_tree_tokens": 6,
                                              "draft_length": {"policy": "fixed"}})
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=1),
              SamplingParams(temperature=0.8, seed=1, max_tokens=20, ignore_eos=True)]
    outs = run(engine, PROMPTS[:2], params)
    assert all(len(o.outputs[0].token_ids) == 20 for o in outs)
    m = engine.get_metrics()
    assert m["proposer_errors"] == 0 and m["num_draft_tokens"] > 2 * m["num_steps"], m
