"""Token trees end to end: greedy output equals the engine without speculation,
a tree of one child per node equals today's chain token for token, trees
really branch and get accepted past their first child, and the drawn
schedules (preemptions, aborts, chunked prefill, prefix caching) with trees
match solo runs (``test_schedule_properties.check_schedules``).

The proposers are the tree-proposing built-ins, ``ngram`` and ``suffix``; the
target is a tiny llama with a 16-token vocabulary, whose text repeats, so
earlier matches exist and disagree (the random 400-token one almost never
accepts a proposal).
"""

from __future__ import annotations

import pytest
import torch
from test_schedule_properties import ANY, check_schedules, schedule_models  # noqa: F401 - a fixture

from spec_helpers import run, token_ids
from speculant import LLM, SamplingParams
from speculant.interfaces import Proposals, Proposer
from speculant.proposers.ngram import propose_continuation
from tiny_models import build_model

V = 16
PROMPTS = [torch.randint(V, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 9, 17, 30)]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
TREE_EXAMPLES = 12


def llm(model_dir, **spec) -> LLM:
    return LLM(model=str(model_dir), block_size=4, num_blocks=256, max_num_batched_tokens=64, max_num_seqs=4,
               speculative=spec)


@pytest.fixture(scope="module")
def v16(tmp_path_factory, tokenizer_dir):
    return build_model("llama", tmp_path_factory.mktemp("v16_trees"), tokenizer_dir, vocab_size=V, seed=7)


@pytest.fixture(scope="module")
def plain(v16):
    return token_ids(run(llm(v16), PROMPTS, GREEDY))


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
@pytest.mark.parametrize("width, nodes, depth", [(2, 4, 2), (2, 8, 4), (3, 8, 3), (4, 16, 6)])
def test_greedy_trees_equal_no_speculation(v16, plain, proposer, width, nodes, depth):
    engine = llm(v16, proposer=proposer, num_speculative_tokens=depth, tree_width=width,
                 max_tree_tokens=nodes, draft_length={"policy": "fixed"})
    paths = record_paths(engine)
    assert token_ids(run(engine, PROMPTS, GREEDY)) == plain
    assert engine.get_metrics()["num_accepted_tokens"] > 0
    if proposer == "ngram":  # its first continuation is nodes 0, 1, ...: a path off it took another branch
        assert any(p != list(range(len(p))) for p in paths), "no step accepted a branch past the first"


def record_paths(engine: LLM) -> list[list[int]]:
    """Every accepted path the proposer is told of (``AcceptedNodes.nodes``), appended as steps run."""
    paths: list[list[int]] = []
    guard = engine.engine.guard
    commit = guard.commit

    def recorded(proposer, batch, accepted, scores):
        paths.extend(accepted.nodes)
        return commit(proposer, batch, accepted, scores)

    guard.commit = recorded
    return paths


class ChainAsTree(Proposer):
    """Wraps the engine's ngram proposer: its chains (as ``propose_continuation`` gives
    them without trees), handed over as trees of one child per node."""

    def __init__(self, real: Proposer) -> None:
        self.real, self.context, self.options, self.capabilities = real, real.context, real.options, real.capabilities

    def propose(self, batch):
        rows = [propose_continuation(d.request.token_ids, d.num_spec_tokens, self.options.min_n, self.options.max_n)
                for d in batch.decodes]
        chain = Proposals.from_lists(rows)
        parents = [j - 1 for r in rows for j in range(len(r))]
        return Proposals(chain.token_ids, chain.cu_num_draft_tokens, parents=torch.tensor(parents, dtype=torch.long))


def test_a_tree_of_one_child_per_node_is_the_chain(v16):
    """Same tokens, and the same proposals drafted and accepted, as the chain proposer."""
    chain = llm(v16, proposer="ngram", num_speculative_tokens=4, draft_length={"policy": "fixed"})
    tree = llm(v16, proposer="ngram", num_speculative_tokens=4, tree_width=2, max_tree_tokens=4,
               draft_length={"policy": "fixed"})
    tree.engine.spec.proposer = ChainAsTree(tree.engine.spec.proposer)
    assert token_ids(run(tree, PROMPTS, GREEDY)) == token_ids(run(chain, PROMPTS, GREEDY))
    a, b = chain.get_metrics(), tree.get_metrics()
    for key in ("num_draft_tokens", "num_accepted_tokens"):
        assert a[key] == b[key], (key, a[key], b[key])


def test_tree_schedules_match_solo_runs(schedule_models):  # noqa: F811 - the fixture imported above
    """Random schedules with token trees (ngram and suffix): chunk sizes, preemptions,
    aborts, stop rules, prefix caching and sampled requests, each request equal to its
    solo run (greedy: also to no speculation); the draws include a preemption and an abort."""
    check_schedules(schedule_models, "trees", TREE_EXAMPLES, ("ngram", "suffix"), proposers=("ngram", "suffix"),
                    trees=True)


def test_the_matrix_and_the_checker_say_which_plugins_take_trees():
    from speculant.config.compat import validate_config
    from speculant.config.matrix import compute_matrix
    from speculant.config.models import ConfigError, EngineConfig
    from speculant.plugins.manager import load_plugins

    registry = load_plugins().registry
    cells = {(c.proposer, c.scorer, c.acceptance): c for c in compute_matrix(registry)}
    assert cells["ngram", "mqa", "rejection"].trees_label() == "✅"
    assert cells["suffix", "mqa", "rejection"].trees_label() == "✅"
    assert cells["ngram", "mqa", "typical"].trees_label() == "❌ acceptance takes chains only"
    assert cells["draft_model", "mqa", "rejection"].trees_label() == "❌ proposer proposes chains only"
    config = EngineConfig.model_validate({
        "model": {"path": "unused", "device": "cpu"},
        "speculative": {"proposer": "ngram", "scorer": "batch_expansion", "tree_width": 2}})
    with pytest.raises(ConfigError) as info:
        validate_config(config, registry)
    assert info.value.problems == [
        "speculative.tree_width = 2, but scorer 'batch_expansion' cannot verify token trees: its expanded rows share "
        "the request's sequence and write K/V at start + j, so siblings at one depth would collide on one slot: "
        "set speculative.tree_width = 1 (chains) or set speculative.scorer to a scorer that verifies trees"]
