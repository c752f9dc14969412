"""Rejection sampling: crafted accept/reject cases, greedy rows, the documented
random-draw order, batch independence and a statistical losslessness test."""

from __future__ import annotations

import pytest
import torch

from flat_inputs import accept_padded
from speculant.acceptance.rejection import RejectionSampler, sample_from_probs
from speculant.interfaces import PLACEHOLDER_TOKEN_ID

P = PLACEHOLDER_TOKEN_ID


def logprobs(probs) -> torch.Tensor:
    """Log of a probability table; zeros become -inf like filtered tokens."""
    return torch.as_tensor(probs, dtype=torch.float64).log().float()


def generators(seeds) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def run(target_probs, draft_ids, draft_probs=None, lens=None, greedy=None, seeds=None):
    target = logprobs(target_probs)
    ids = torch.as_tensor(draft_ids, dtype=torch.long)
    n, k = ids.shape
    lens = torch.full((n,), k, dtype=torch.long) if lens is None else torch.as_tensor(lens, dtype=torch.long)
    greedy = torch.zeros(n, dtype=torch.bool) if greedy is None else torch.as_tensor(greedy, dtype=torch.bool)
    q = None if draft_probs is None else torch.as_tensor(draft_probs, dtype=torch.float32)
    gens = generators(range(n) if seeds is None else seeds)
    return accept_padded(RejectionSampler(), target, ids, q, lens, greedy, gens)


def test_declares_lossless_sampling_without_draft_probs():
    caps = RejectionSampler.capabilities
    assert (RejectionSampler.name, caps.lossless, caps.needs_draft_probs, caps.supports_sampling) == (
        "rejection", True, False, True)


# Cases whose verdict does not depend on the random draw: (p_0, q_0 or None,
# proposal, accepted?, tokens the emitted token may be). p_1 is uniform over 4.
SURE_CASES = {
    "p >= q accepts": ([.1, .6, .2, .1], [.1, .3, .3, .3], 1, True, {0, 1, 2, 3}),
    "p = 0 rejects, residual": ([.5, .5, 0, 0], [.25] * 4, 2, False, {0, 1}),
    "one-hot, p = 1 accepts": ([0, 1, 0, 0], None, 1, True, {0, 1, 2, 3}),
    "one-hot, p = 0 rejects": ([.2, .8, 0, 0], None, 3, False, {0, 1}),
    "q(x) = 0 < p(x) accepts": ([.5, .5, 0, 0], [1, 0, 0, 0], 1, True, {0, 1, 2, 3}),
    "q(x) = p(x) = 0 rejects, p fallback": ([.5, .5, 0, 0], [.5, .5, 0, 0], 3, False, {0, 1}),
    "residual excludes over-proposed token": ([.5, .5, 0, 0], [.9, .1, 0, 0], 2, False, {1}),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", SURE_CASES.values(), ids=SURE_CASES.keys())
def test_sure_verdicts(case, seed):
    p0, q0, x, accepted, allowed = case
    q = None if q0 is None else [[q0]]
    out = run([[p0, [.25] * 4]], [[x]], q, seeds=[seed])
    assert out.num_accepted.tolist() == [int(accepted)]
    emitted = out.token_ids[0].tolist()
    assert emitted[0] == x if accepted else emitted[1] == P
    assert emitted[int(accepted)] in allowed


def test_residual_without_mass_falls_back_to_target():
    # q >= p everywhere (unnormalized draft): rejection is possible, residual is empty.
    n = 400
    out = run([[[.5, .5, 0, 0], [.25] * 4]] * n, [[0]] * n, [[[1, 1, 1, 1]]] * n, seeds=range(n))
    rejected = out.num_accepted == 0
    recovered = out.token_ids[rejected, 0]
    assert 100 < int(rejected.sum()) < 300  # accepted with probability 1/2
    assert set(recovered.tolist()) == {0, 1}  # drawn from p, never a filtered token


TARGET_ARGMAX = [2, 0, 4, 1]  # target argmax at positions 0..3 (k = 3)
GREEDY_CASES = {
    "all match, bonus": ([2, 0, 4], 3, 3, [2, 0, 4, 1]),
    "mismatch at 2": ([2, 0, 3], 3, 2, [2, 0, 4, P]),
    "mismatch at 0": ([1, 0, 4], 3, 0, [2, P, P, P]),
    "no proposals": ([P, P, P], 0, 0, [2, P, P, P]),
    "lens 2, all match": ([2, 0, P], 2, 2, [2, 0, 4, P]),
    "lens 1 ignores past lens": ([2, 3, 3], 1, 1, [2, 0, P, P]),
}


@pytest.mark.parametrize("draft_kind", ["one_hot", "full"])
@pytest.mark.parametrize("case", GREEDY_CASES.values(), ids=GREEDY_CASES.keys())
def test_greedy_rows_match_argmax_and_draw_nothing(case, draft_kind):
    ids, lens, num_accepted, tokens = case
    probs = torch.full((4, 5), 0.1)
    probs[torch.arange(4), torch.tensor(TARGET_ARGMAX)] = 0.6
    draft = None if draft_kind == "one_hot" else torch.full((1, 3, 5), 0.2)
    gen = torch.Generator().manual_seed(7)
    state = gen.get_state()
    out = accept_padded(RejectionSampler(), logprobs(probs).unsqueeze(0), torch.tensor([ids]), draft,
                        torch.tensor([lens]), torch.tensor([True]), [gen])
    assert out.num_accepted.tolist() == [num_accepted]
    assert out.token_ids[0].tolist() == tokens
    assert torch.equal(gen.get_state(), state)


@pytest.mark.parametrize("seed", range(24))
def test_documented_draw_order(seed):
    # One-hot draft, p(x_j) = 1/2 at both positions; residual after rejecting
    # token 0 is uniform on {1, 2}; the bonus distribution is uniform on 4 tokens.
    p_step = [.5, .25, .25, 0]
    out = run([[p_step, p_step, [.25] * 4]], [[0, 0]], seeds=[seed])
    u = torch.rand(3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).tolist()
    expected_accepted = 0 if u[0] >= .5 else (1 if u[1] >= .5 else 2)
    expected_final = int(u[2] * 4) if expected_accepted == 2 else (1 if u[2] < .5 else 2)
    assert out.num_accepted.tolist() == [expected_accepted]
    assert out.token_ids[0, expected_accepted].item() == expected_final


def test_sample_from_probs_never_returns_zero_mass_tokens():
    probs = torch.tensor([[0, .3, 0, .7, 0]] * 4)
    uniforms = torch.tensor([0.0, 0.29, 0.31, 1 - 2 ** -53], dtype=torch.float64)
    assert sample_from_probs(probs, uniforms).tolist() == [1, 1, 3, 3]


def random_batch(n: int, k: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(n, k + 1, vocab, generator=g).mul(2).log_softmax(-1)
    draft = torch.randn(n, k, vocab, generator=g).mul(2).softmax(-1)
    ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(n, k)
    lens = torch.randint(0, k + 1, (n,), generator=g)
    ids = torch.where(torch.arange(k) < lens.unsqueeze(1), ids, PLACEHOLDER_TOKEN_ID)
    greedy = torch.tensor([i % 3 == 0 for i in range(n)])
    return target, ids, draft, lens, greedy


@pytest.mark.parametrize("draft_kind", ["one_hot", "full"])
def test_row_result_is_independent_of_batch_composition(draft_kind):
    target, ids, draft, lens, greedy = random_batch(n=9, k=4, vocab=11, seed=3)
    draft = None if draft_kind == "one_hot" else draft
    seeds = [100 + i for i in range(9)]
    batched = accept_padded(RejectionSampler(), target, ids, draft, lens, greedy, generators(seeds))
    for i in range(9):
        k_i = int(lens[i])  # alone, with no padding beyond its own proposals
        alone = accept_padded(
            RejectionSampler(), target[i:i + 1, :k_i + 1], ids[i:i + 1, :k_i],
            None if draft is None else draft[i:i + 1, :k_i], lens[i:i + 1], greedy[i:i + 1],
            generators(seeds[i:i + 1]))
        assert alone.num_accepted.item() == batched.num_accepted[i].item()
        emitted = int(batched.num_accepted[i]) + 1
        assert alone.token_ids[0, :emitted].tolist() == batched.token_ids[i, :emitted].tolist()
        assert set(batched.token_ids[i, emitted:].tolist()) <= {PLACEHOLDER_TOKEN_ID}


def test_seeds_change_sampled_rows():
    target, ids, draft, lens, greedy = random_batch(n=64, k=3, vocab=11, seed=5)
    greedy[:] = False
    first = accept_padded(RejectionSampler(), target, ids, draft, lens, greedy, generators(range(64)))
    again = accept_padded(RejectionSampler(), target, ids, draft, lens, greedy, generators(range(64)))
    other = accept_padded(RejectionSampler(), target, ids, draft, lens, greedy, generators(range(64, 128)))
    assert torch.equal(first.token_ids, again.token_ids)
    assert not torch.equal(first.token_ids, other.token_ids)


# --- statistical losslessness ---------------------------------------------------------
# A tiny "model" over V = 6 tokens: target p0 (token 5 filtered out), target at the
# second position T[a] given the first token a, a third-position table for bonus
# tokens; the draft has its own q0 and Q[a], and does propose the filtered token.
# Two engine steps are simulated per row so every row yields two tokens (y0, y1);
# their joint must be p0(a) * T[a](b). Bound: Pearson chi-square p-value > 1e-3 on
# N = 40,000 rows, deterministic because everything is seeded.
V, N = 6, 40_000


def tiny_model():
    g = torch.Generator().manual_seed(1234)
    p0 = torch.rand(V, generator=g) + 0.2
    p0[5] = 0.0
    t1 = torch.rand(V, V, generator=g) ** 2
    t1[torch.arange(V), (torch.arange(V) + 1) % V] = 0.0  # each row filters one token
    t2 = torch.rand(V, V, V, generator=g)
    q0 = torch.rand(V, generator=g) ** 3 + 0.01
    q1 = torch.rand(V, V, generator=g) ** 3 + 0.01
    norm = lambda t: t / t.sum(-1, keepdim=True)  # noqa: E731
    return norm(p0), norm(t1), norm(t2), norm(q0), norm(q1)


def one_step(sampler, first_target, first_draft, next_target, next_draft, after_target, one_hot, lens, g,
             seed0):
    """Draft two tokens (x0 ~ first_draft, x1 ~ next_draft(x0)), verify ``lens`` of them."""
    n = lens.shape[0]
    x0 = torch.multinomial(first_draft, 1, generator=g).squeeze(1)
    x1 = torch.multinomial(next_draft(x0), 1, generator=g).squeeze(1)
    ids = torch.where(torch.arange(2) < lens.unsqueeze(1), torch.stack([x0, x1], 1), PLACEHOLDER_TOKEN_ID)
    target = torch.stack([first_target, next_target(x0), after_target(x0, x1)], dim=1)
    draft = None if one_hot else torch.stack([first_draft, next_draft(x0)], dim=1)
    gens = generators(range(seed0, seed0 + n))
    return accept_padded(sampler, logprobs(target), ids, draft, lens, torch.zeros(n, dtype=torch.bool), gens)


def sample_two_tokens(one_hot: bool) -> torch.Tensor:  # [N, 2]
    p0, t1, t2, q0, q1 = tiny_model()
    g = torch.Generator().manual_seed(99)
    sampler = RejectionSampler()
    lens = torch.randint(0, 3, (N,), generator=g)
    out = one_step(sampler, p0.expand(N, V), q0.expand(N, V), lambda x0: t1[x0], lambda x0: q1[x0],
                   lambda x0, x1: t2[x0, x1], one_hot, lens, g, seed0=0)
    y0, y1 = out.token_ids[:, 0], out.token_ids[:, 1].clone()
    again = (out.num_accepted == 0).nonzero().squeeze(1)  # rows that emitted one token
    a = y0[again]
    # Next step for those rows: the context ends with a, so the target is T[a]; the
    # positions after it only need valid distributions, their tokens are not counted.
    nxt = one_step(sampler, t1[a], q1[a], lambda x0: t2[a, x0], lambda x0: q1[x0],
                   lambda x0, x1: t2[x0, x1], one_hot, torch.randint(0, 3, (a.numel(),), generator=g), g,
                   seed0=N)
    y1[again] = nxt.token_ids[:, 0]
    return torch.stack([y0, y1], dim=1)


def chi_square_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    counts, expected = counts.double().flatten(), expected_probs.double().flatten() * counts.sum()
    assert counts[expected == 0].sum() == 0, "a token with zero target probability was emitted"
    keep = expected > 0
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2).item()


@pytest.mark.parametrize("draft_kind", ["full", "one_hot"])
def test_lossless_joint_of_two_tokens(draft_kind):
    pairs = sample_two_tokens(one_hot=draft_kind == "one_hot")
    p0, t1, _, q0, q1 = tiny_model()
    counts = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).reshape(V, V)
    target_joint = p0.unsqueeze(1) * t1
    assert chi_square_pvalue(counts.sum(1), p0) > 1e-3  # first token ~ p0
    assert chi_square_pvalue(counts, target_joint) > 1e-3  # (first, second) ~ target joint
    tv = 0.5 * (counts / N - target_joint).abs().sum().item()
    assert tv < 0.02
    # The test has power: the same samples are far from the draft's own joint.
    assert chi_square_pvalue(counts, q0.unsqueeze(1) * q1) < 1e-6
