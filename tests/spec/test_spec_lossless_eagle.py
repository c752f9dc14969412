"""Lossless sampling end to end with the EAGLE proposer: the statistical test
of ``test_spec_lossless.py`` (same 16-token llama, prompt, N seeded requests,
chi-square per output position, same power check) with a randomly
initialised EAGLE head (full vocabulary) as the proposer."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_spec_lossless import (
    MAX_TOKENS,
    K,
    N,
    V,
    assert_follows_marginals,
    chi_square_p,
    filtered_probs,
    marginals,
    small_vocab,  # noqa: F401 - the shared fixture
)
from transformers import AutoModelForCausalLM

from spec_helpers import run
from speculant import LLM, SamplingParams
from speculant.proposers.eagle.model import EagleHead
from tiny_eagle import save_random_eagle


@pytest.fixture(scope="module")
def v16_eagle(small_vocab, tmp_path_factory):  # noqa: F811
    return save_random_eagle(small_vocab[0], tmp_path_factory.mktemp("v16_eagle"), None, seed=2)


@torch.no_grad()
def eagle_first_draft(target, head_dir, prompt: list[int], sp: SamplingParams) -> torch.Tensor:
    """[V, V]: row a is the head's filtered distribution of its first proposal
    after the prompt and the sampled token a (entries: the prompt's tokens 1..
    then a, beside the target's hidden states over the prompt)."""
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    head = EagleHead(json.loads((head_dir / "config.json").read_text()))
    head.load_state_dict(load_file(str(head_dir / "model.safetensors")))
    hidden = model.base_model(input_ids=torch.tensor([prompt])).last_hidden_state.expand(V, -1, -1)
    following = torch.cat([torch.tensor(prompt[1:]).expand(V, -1), torch.arange(V).unsqueeze(1)], dim=1)
    feats = head(model.get_input_embeddings()(following), hidden)[:, -1]
    return filtered_probs(head.draft_logits(feats, model.get_output_embeddings()), sp.temperature, sp.top_k,
                          sp.top_p, sp.min_p)


@pytest.mark.parametrize(("sampling", "threshold"), [
    (dict(temperature=1.0), 0.0),
    # runs of different lengths: each request stops after a proposal the head gives < 0.15
    (dict(temperature=1.0), 0.15),
    pytest.param(dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.02), 0.0, marks=pytest.mark.slow),  # CI time
], ids=["plain", "plain-confidence", "filtered"])
def test_eagle_rejection_sampling_matches_target_distribution(sampling, threshold, small_vocab,  # noqa: F811
                                                              v16_eagle):
    target, _, prompts = small_vocab
    prompt = prompts["draft_model"]  # a permutation of the vocabulary
    llm = LLM(model=str(target), max_num_seqs=1024, max_num_batched_tokens=1024 * (len(prompt) + 1),
              speculative={"proposer": "eagle", "acceptance": "rejection", "num_speculative_tokens": K,
                           "proposer_options": {"path": str(v16_eagle), "confidence_threshold": threshold}})
    params = [SamplingParams(seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, **sampling) for i in range(N)]
    tokens = torch.tensor([o.outputs[0].token_ids for o in run(llm, [prompt] * N, params)])
    m = llm.get_metrics()
    assert m["num_accepted_tokens"] >= 100 and m["num_draft_tokens"] - m["num_accepted_tokens"] >= 100, m
    if threshold:  # some runs stopped after one proposal, others drafted K: both kinds were verified
        assert m["num_steps"] < m["num_draft_tokens"] < m["num_steps"] * K, m
    expected = marginals(target, prompt, params[0])
    assert_follows_marginals(tokens, expected, "eagle")
    # power: emitting the head's first proposal unchecked gives a marginal the test rejects
    unchecked = expected[0] @ eagle_first_draft(target, v16_eagle, prompt, params[0]).double()
    assert chi_square_p(torch.bincount(tokens[:, 1], minlength=V), unchecked) < 1e-6


def _hybrid_tokens(target, prompt, head_dir, params) -> tuple[torch.Tensor, LLM]:
    # min_match_len 1, min_suffix_score 2 (= K): a suffix match continuing unanimously for K tokens drafts
    # from the suffix part, a split one from the head: about half the decode-steps each
    llm = LLM(model=str(target), max_num_seqs=1024, max_num_batched_tokens=1024 * (len(prompt) + 1),
              speculative={"proposer": "eagle_suffix", "acceptance": "rejection", "num_speculative_tokens": K,
                           "proposer_options": {"eagle": {"path": str(head_dir)}, "min_match_len": 1,
                                                "min_suffix_score": float(K)}})
    return torch.tensor([o.outputs[0].token_ids for o in run(llm, [prompt] * N, params)]), llm


def test_eagle_suffix_hybrid_rejection_sampling_matches_target_distribution(small_vocab, v16_eagle,  # noqa: F811
                                                                           monkeypatch):
    """Suffix rows (one-hot draft probs) and head rows (full draft probs) in the same
    steps: the output follows the target's marginals; giving the suffix rows any
    other distribution than their one-hot breaks it (the test's power)."""
    import speculant.proposers.hybrid as hybrid_module

    target, _, prompts = small_vocab
    prompt = prompts["draft_model"]
    params = [SamplingParams(seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=1.0) for i in range(N)]
    tokens, llm = _hybrid_tokens(target, prompt, v16_eagle, params)
    hybrid = llm.engine.spec.proposer
    assert hybrid.num_suffix_drafts >= 1000 and hybrid.num_model_drafts >= 1000, (
        hybrid.num_suffix_drafts, hybrid.num_model_drafts)
    m = llm.get_metrics()
    assert m["num_accepted_tokens"] >= 100 and m["num_draft_tokens"] - m["num_accepted_tokens"] >= 100, m
    expected = marginals(target, prompt, params[0])
    assert_follows_marginals(tokens, expected, "eagle_suffix")

    def uniform(ids, vocab):  # a wrong draft distribution for the suffix's deterministic proposals
        return torch.full((ids.shape[0], vocab), 1.0 / vocab)

    monkeypatch.setattr(hybrid_module, "deterministic_probs", uniform)
    wrong, _ = _hybrid_tokens(target, prompt, v16_eagle, params)
    assert min(chi_square_p(torch.bincount(wrong[:, j], minlength=V), expected[j]) for j in range(1, MAX_TOKENS)) < 1e-6


def _tree_tokens(target, prompt, head_dir, params) -> tuple[torch.Tensor, LLM]:
    llm = LLM(model=str(target), max_num_seqs=1024, max_num_batched_tokens=1024 * (len(prompt) + 1),
              speculative={"proposer": "eagle", "acceptance": "rejection", "num_speculative_tokens": K,
                           "tree_width": 3, "max_tree_tokens": 6, "draft_length": {"policy": "fixed"},
                           "proposer_options": {"path": str(head_dir)}})
    return torch.tensor([o.outputs[0].token_ids for o in run(llm, [prompt] * N, params)]), llm


def test_eagle_sampled_trees_match_target_distribution(small_vocab, v16_eagle, monkeypatch):  # noqa: F811
    """EAGLE token trees at temperature 0.8 (siblings drawn without replacement from the
    head's distribution, verified by multi-candidate rejection with those probabilities):
    the output follows the target's marginals; verifying the same draws against a
    distribution other than the one they were drawn from breaks it (the test's power)."""
    import speculant.sampling.tree_acceptance as tree_acceptance

    target, _, prompts = small_vocab
    prompt = prompts["draft_model"]
    params = [SamplingParams(seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8) for i in range(N)]
    paths: list[list[int]] = []
    real = tree_acceptance.sampled_tree_path

    def recorded(probs, tokens, parents, uniforms, draft_probs=None):
        assert draft_probs is not None, "a sampled EAGLE tree reached acceptance without its draft probabilities"
        path, final = real(probs, tokens, parents, uniforms, draft_probs)
        paths.append(path)
        return path, final

    monkeypatch.setattr(tree_acceptance, "sampled_tree_path", recorded)
    tokens, llm = _tree_tokens(target, prompt, v16_eagle, params)
    m = llm.get_metrics()
    assert m["num_accepted_tokens"] >= 100 and m["num_draft_tokens"] - m["num_accepted_tokens"] >= 100, m
    assert sum(1 for p in paths if p and p[0] != 0) >= 100, "few steps accepted a sibling after the first"
    expected = marginals(target, prompt, params[0])
    assert_follows_marginals(tokens, expected, "eagle trees")

    def uniform_q(probs, tokens, parents, uniforms, draft_probs=None):  # the draws verified against a wrong q
        return real(probs, tokens, parents, uniforms, torch.full_like(draft_probs, 1.0 / V))

    monkeypatch.setattr(tree_acceptance, "sampled_tree_path", uniform_q)
    wrong, _ = _tree_tokens(target, prompt, v16_eagle, params)
    assert min(chi_square_p(torch.bincount(wrong[:, j], minlength=V), expected[j]) for j in range(1, MAX_TOKENS)) < 1e-6
