"""Typical acceptance: the rule on crafted distributions, the sampled token after
the accepted run, greedy rows, options validation and batch independence."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from flat_inputs import accept_padded
from speculant.acceptance import TypicalAcceptance, TypicalOptions
from speculant.interfaces import PLACEHOLDER_TOKEN_ID

P = PLACEHOLDER_TOKEN_ID


def logprobs(probs) -> torch.Tensor:
    return torch.as_tensor(probs, dtype=torch.float64).log().float()


def generators(seeds) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def run(target_probs, draft_ids, lens=None, greedy=None, seeds=None, **options):
    target = logprobs(target_probs)
    ids = torch.as_tensor(draft_ids, dtype=torch.long)
    n, k = ids.shape
    lens = torch.full((n,), k, dtype=torch.long) if lens is None else torch.as_tensor(lens, dtype=torch.long)
    greedy = torch.zeros(n, dtype=torch.bool) if greedy is None else torch.as_tensor(greedy, dtype=torch.bool)
    method = TypicalAcceptance(TypicalOptions(**options))
    return accept_padded(method, target, ids, None, lens, greedy,
                         generators(range(n) if seeds is None else seeds))


def test_declares_lossy_sampling_method():
    caps = TypicalAcceptance.capabilities
    assert (TypicalAcceptance.name, caps.lossless, caps.needs_draft_probs, caps.supports_sampling) == (
        "typical", False, False, True)
    assert TypicalAcceptance().options == TypicalOptions(posterior_threshold=0.09, posterior_alpha=0.3)


PEAKED = [.97, .01, .01, .01]  # H = 0.168 nats: alpha * exp(-H) = 0.254, so the 0.09 cap binds
TWO_WAY = [.85, .15, 0, 0]  # H = 0.423: alpha * exp(-H) = 0.197, the cap binds at 0.09
UNIFORM16 = [1 / 16] * 16  # H = ln 16: alpha * exp(-H) = 0.019 binds, below the 0.09 cap
# (target p at the proposal position, proposal, options, accepted?)
RULE_CASES = {
    "peaked, likely token": (PEAKED, 0, {}, True),
    "peaked, unlikely token (cap binds)": (PEAKED, 1, {}, False),
    "two-way, 0.15 above the 0.09 cap": (TWO_WAY, 1, {}, True),
    "two-way, cap raised to 0.2, alpha term 0.197 binds": (TWO_WAY, 1, {"posterior_threshold": 0.2}, False),
    "uniform 16, 0.0625 above entropy term 0.019": (UNIFORM16, 3, {}, True),
    "uniform 16, alpha 1: 0.0625 not above 0.0625": (UNIFORM16, 3, {"posterior_alpha": 1.0}, False),
    "filtered token (p = 0)": (TWO_WAY, 2, {"posterior_threshold": 0.0, "posterior_alpha": 0.0}, False),
    "threshold 0 keeps any token with mass": (PEAKED, 1, {"posterior_threshold": 0.0}, True),
}


@pytest.mark.parametrize("case", RULE_CASES.values(), ids=RULE_CASES.keys())
def test_rule(case):
    probs, x, options, accepted = case
    vocab = len(probs)
    out = run([[probs, [1 / vocab] * vocab]], [[x]], **options)
    assert out.num_accepted.tolist() == [int(accepted)]


def test_crafted_entropies_are_what_the_table_says():
    entropy = lambda p: -sum(v * math.log(v) for v in p if v > 0)  # noqa: E731
    assert 0.3 * math.exp(-entropy(PEAKED)) == pytest.approx(0.254, abs=1e-3)
    assert 0.3 * math.exp(-entropy(TWO_WAY)) == pytest.approx(0.197, abs=1e-3)
    assert 0.3 * math.exp(-entropy(UNIFORM16)) == pytest.approx(0.019, abs=1e-3)


def test_stops_at_first_rejection_even_if_later_proposals_pass():
    # Position 0 accepts token 0, position 1 rejects token 1, position 2 would accept token 0.
    out = run([[PEAKED, PEAKED, PEAKED, PEAKED]], [[0, 1, 0]])
    assert out.num_accepted.tolist() == [1]
    assert out.token_ids[0, 0].item() == 0 and out.token_ids[0, 2:].tolist() == [P, P]


def expected_sample(probs: list[float], seed: int) -> int:
    """The documented draw: one float64 uniform, inverted through the CDF."""
    u = torch.rand(1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).item()
    cdf = 0.0
    for token, p in enumerate(probs):
        cdf += p
        if u * sum(probs) < cdf:
            return token
    raise AssertionError("unreachable")


@pytest.mark.parametrize("seed", range(12))
def test_emitted_token_after_rejection_is_sampled_from_target(seed):
    at_rejection = [.4, .3, .2, .1]
    out = run([[[.97, .01, .01, .01], at_rejection, [.25] * 4]], [[0, 3]], seeds=[seed],
              posterior_threshold=0.2, posterior_alpha=1.0)  # threshold at position 1: 0.2 > 0.1
    assert out.num_accepted.tolist() == [1]
    assert out.token_ids[0, 1].item() == expected_sample(at_rejection, seed)


@pytest.mark.parametrize("seed", range(6))
def test_bonus_token_is_sampled_from_target_after_last_proposal(seed):
    bonus = [.1, .2, .3, .4]
    out = run([[PEAKED, bonus]], [[0]], seeds=[seed])
    assert out.num_accepted.tolist() == [1]
    assert out.token_ids[0, 1].item() == expected_sample(bonus, seed)


def test_rejected_position_sample_follows_target_frequencies():
    n = 4000
    at_rejection = [.5, .3, .2, 0]
    out = run([[at_rejection, [.25] * 4]] * n, [[3]] * n, seeds=range(n))  # p = 0: rejected
    assert out.num_accepted.eq(0).all()
    freq = torch.bincount(out.token_ids[:, 0], minlength=4).double() / n
    assert torch.allclose(freq, torch.tensor(at_rejection, dtype=torch.float64), atol=0.03)


@pytest.mark.parametrize("ids,lens,num_accepted,tokens", [
    ([1, 2], 2, 2, [1, 2, 0]),
    ([1, 0], 2, 1, [1, 2, P]),
    ([3, 2], 2, 0, [1, P, P]),
    ([P, P], 0, 0, [1, P, P]),
])
def test_greedy_rows_match_argmax_and_draw_nothing(ids, lens, num_accepted, tokens):
    # Argmax 1, 2, 0; uniform-ish targets where typical acceptance would keep anything.
    target = [[.2, .3, .25, .25], [.25, .2, .3, .25], [.3, .25, .2, .25]]
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    out = accept_padded(TypicalAcceptance(), logprobs([target]), torch.tensor([ids]), None, torch.tensor([lens]),
                        torch.tensor([True]), [gen])
    assert out.num_accepted.tolist() == [num_accepted]
    assert out.token_ids[0].tolist() == tokens
    assert torch.equal(gen.get_state(), state)


def test_row_result_is_independent_of_batch_composition():
    g = torch.Generator().manual_seed(8)
    n, k, vocab = 8, 3, 9
    target = torch.randn(n, k + 1, vocab, generator=g).log_softmax(-1)
    lens = torch.randint(0, k + 1, (n,), generator=g)
    ids = torch.where(torch.arange(k) < lens.unsqueeze(1), torch.randint(0, vocab, (n, k), generator=g), P)
    greedy = torch.arange(n) % 4 == 0
    seeds = list(range(50, 50 + n))
    batched = accept_padded(TypicalAcceptance(), target, ids, None, lens, greedy, generators(seeds))
    for i in range(n):
        k_i = int(lens[i])
        alone = accept_padded(TypicalAcceptance(), target[i:i + 1, :k_i + 1], ids[i:i + 1, :k_i], None,
                              lens[i:i + 1], greedy[i:i + 1], generators(seeds[i:i + 1]))
        emitted = int(batched.num_accepted[i]) + 1
        assert alone.num_accepted.item() == emitted - 1
        assert alone.token_ids[0, :emitted].tolist() == batched.token_ids[i, :emitted].tolist()


@pytest.mark.parametrize("options,fragment", [
    ({"posterior_threshold": -0.1}, "posterior_threshold"),
    ({"posterior_threshold": 1.5}, "posterior_threshold"),
    ({"posterior_alpha": -1}, "posterior_alpha"),
    ({"posterior_aplha": 0.3}, "posterior_aplha"),
])
def test_options_validation_names_the_option(options, fragment):
    with pytest.raises(ValidationError, match=fragment):
        TypicalOptions(**options)
