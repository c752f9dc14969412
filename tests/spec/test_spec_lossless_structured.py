"""Lossless sampling under a grammar: with ``rejection`` acceptance and a
grammar mask at every verified row, the sampled tokens follow the target's
masked, renormalized distribution (the chi-square setup of
test_spec_lossless.py: a 16-token llama, N = 2000 seeded requests,
4 tokens each, k = 2, exact marginals from transformers' logits).

The grammar is a regex whose allowed set depends on the position:
``[!-*][%-.]...`` allows ids 2-11 at even output positions and ids 6-15 at odd
ones (overlapping, so a mask row shifted by one shows only statistically and
in forbidden tokens). The n-gram proposer's one-hot proposals the grammar
forbids are cut before verification; the draft model's sampled proposals are
not (they come with their distribution q), so the mask rejects them.

Power: the chi-square machinery's own power is shown in test_spec_lossless.py
(same N, same helper); here a mask row shifted by one, a missing mask or an
unmasked acceptance test shows as forbidden tokens, which fail at once. (An
engine that also cut the draft model's sampled proposals, which is not exact,
gave p = 0.1 at this N: too small a bias to test for, so ``cut_proposals``
simply refuses to.)
"""

from __future__ import annotations

import pytest
import torch
from test_spec_lossless import MAX_TOKENS, PROPOSER_OPTIONS, K, N, V, chi_square_p, filtered_probs, small_vocab
from transformers import AutoModelForCausalLM

from spec_helpers import run
from speculant import LLM, SamplingParams

__all__ = ["small_vocab"]  # the fixture, shared with tests/spec/test_spec_lossless.py

REGEX = "[!-*][%-.][!-*][%-.][!-*][%-.]"
EVEN = torch.zeros(V, dtype=torch.bool)
EVEN[2:12] = True  # '!'..'*'
ODD = torch.zeros(V, dtype=torch.bool)
ODD[6:16] = True  # '%'..'.'
P_MIN = 1e-3


@torch.no_grad()
def masked_marginals(model_dir, prompt: list[int], sp: SamplingParams) -> list[torch.Tensor]:
    """[m_0..m_3], each [V]: the exact marginal of output token j when the logits are
    masked (even / odd positions) before temperature and the filters."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    grid = torch.cartesian_prod(*[torch.arange(V)] * (MAX_TOKENS - 1)).reshape(-1, MAX_TOKENS - 1)
    seqs = torch.cat([torch.tensor(prompt).expand(grid.shape[0], -1), grid], dim=1)
    logits = torch.cat([model(chunk).logits for chunk in seqs.split(1024)])[:, len(prompt) - 1:]  # [S, 4, V]
    masks = torch.stack([EVEN if j % 2 == 0 else ODD for j in range(MAX_TOKENS)])  # [4, V]
    probs = filtered_probs(logits.masked_fill(~masks, float("-inf")), sp.temperature, sp.top_k, sp.top_p,
                           sp.min_p)
    out, joint = [], None
    for j in range(MAX_TOKENS):
        cond = probs[:, j].reshape(*[V] * (MAX_TOKENS - 1), V)[tuple([slice(None)] * j + [0] * (MAX_TOKENS - 1 - j))]
        joint = cond if joint is None else joint.unsqueeze(-1) * cond
        out.append(joint.reshape(-1, V).sum(0))
    return out


def sample_masked(small_vocab, proposer: str, sampling: dict) -> tuple[torch.Tensor, dict, list[torch.Tensor]]:
    target, draft, prompts = small_vocab
    prompt = prompts[proposer]
    options = PROPOSER_OPTIONS[proposer] if proposer != "draft_model" else {"model": str(draft)}
    llm = LLM(model=str(target), max_num_seqs=1024, max_num_batched_tokens=1024 * (len(prompt) + 1),
              speculative={"proposer": proposer, "proposer_options": options, "acceptance": "rejection",
                           "num_speculative_tokens": K})
    params = [SamplingParams(seed=i, max_tokens=MAX_TOKENS, structured={"regex": REGEX}, **sampling)
              for i in range(N)]
    outs = run(llm, [prompt] * N, params)
    tokens = torch.tensor([o.outputs[0].token_ids for o in outs])  # [N, MAX_TOKENS]
    return tokens, llm.get_metrics(), masked_marginals(target, prompt, params[0])


def min_p_value(tokens: torch.Tensor, expected: list[torch.Tensor], what: str) -> float:
    """Forbidden tokens never sampled; the smallest chi-square p-value over the positions."""
    ps = []
    for j in range(MAX_TOKENS):
        counts = torch.bincount(tokens[:, j], minlength=V)
        allowed = EVEN if j % 2 == 0 else ODD
        assert int(counts[~allowed].sum()) == 0, f"{what}: token {j}: sampled a token the grammar forbids"
        ps.append(chi_square_p(counts, expected[j]))
    return min(ps)


CASES = {
    "draft_full": ("draft_model", dict(temperature=1.0)),
    "ngram_one_hot": ("ngram", dict(temperature=1.0)),
    "draft_filtered": ("draft_model", dict(temperature=0.8, top_k=4)),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow if c == "draft_filtered" else ())
                                  for c in CASES])
def test_rejection_sampling_matches_the_masked_distribution(case, small_vocab):
    proposer, sampling = CASES[case]
    tokens, m, expected = sample_masked(small_vocab, proposer, sampling)
    assert tokens.shape == (N, MAX_TOKENS)
    # proposals were verified, some kept and some rejected under the mask: the test is not vacuous
    assert m["num_accepted_tokens"] >= 100 and m["num_draft_tokens"] - m["num_accepted_tokens"] >= 100, m
    if proposer == "ngram":
        assert m["structured_cut_tokens"] > 0, "the n-gram proposals the grammar forbids are cut"
    else:
        assert m["structured_cut_tokens"] == 0, "sampled draft proposals must not be cut (see the module doc)"
    p = min_p_value(tokens, expected, case)
    assert p > P_MIN, f"{case}: the output does not follow the masked target distribution (p = {p:.2e})"
