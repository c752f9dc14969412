"""The flat layout decides exactly what the padded one did.

A plain reference, row by row on padded ``[n, k + 1, V]`` / ``[n, k]`` tables
(the layout the engine used before), against ``greedy_accept`` and
``RejectionSampler`` on the flat layout, on random ragged batches (decodes
with 0..k proposals, greedy and sampling rows mixed, one-hot and full draft
distributions) with fixed per-row generators: same accepted counts, same
emitted tokens, same random draws.
"""

from __future__ import annotations

import pytest
import torch

from flat_inputs import flatten
from speculant.acceptance.rejection import RejectionSampler
from speculant.interfaces import PLACEHOLDER_TOKEN_ID
from speculant.sampling.acceptance import DraftLayout, greedy_accept
from speculant.sampling.sampler import sample_from_probs


def reference_greedy(logits, ids, lens) -> list[list[int]]:
    out = []
    for i in range(ids.shape[0]):
        argmax = logits[i].argmax(dim=-1).tolist()
        a = 0
        while a < int(lens[i]) and int(ids[i, a]) == argmax[a]:
            a += 1
        out.append(ids[i, :a].tolist() + [argmax[a]])
    return out


def reference_rejection(target_lp, ids, q, lens, greedy, seeds) -> list[list[int]]:
    """Rejection sampling as documented, one row at a time."""
    out = []
    for i in range(ids.shape[0]):
        k_i = int(lens[i])
        if bool(greedy[i]):
            out.extend(reference_greedy(target_lp[i:i + 1], ids[i:i + 1], lens[i:i + 1]))
            continue
        u = torch.rand(k_i + 1, generator=torch.Generator().manual_seed(seeds[i]), dtype=torch.float64)
        a = 0
        while a < k_i:
            x = int(ids[i, a])
            p_x = target_lp[i, a, x].exp()
            q_x = q[i, a, x] if q is not None else torch.tensor(1.0)
            if not bool(u[a] * q_x < p_x):
                break
            a += 1
        p = target_lp[i, a].exp()
        dist = p
        if a < k_i:
            if q is None:
                residual = p.clone()
                residual[int(ids[i, a])] = 0.0
            else:
                residual = (p - q[i, a]).clamp_min(0.0)
            if float(residual.sum()) > 0:
                dist = residual
        token = int(sample_from_probs(dist.unsqueeze(0), u[k_i:k_i + 1])[0])
        out.append(ids[i, :a].tolist() + [token])
    return out


def random_case(seed: int, n: int = 12, k: int = 4, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k + 1, vocab, generator=g) * 2
    draft = torch.randn(n, k, vocab, generator=g).mul(2).softmax(-1)
    proposed = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(n, k)
    # half the proposals copy the target's argmax so greedy rows accept runs too
    ids = torch.where(torch.rand(n, k, generator=g) < 0.5, logits[:, :k].argmax(-1), proposed)
    lens = torch.randint(0, k + 1, (n,), generator=g)
    lens[0], lens[1] = 0, k  # always both extremes
    ids = torch.where(torch.arange(k) < lens.unsqueeze(1), ids, PLACEHOLDER_TOKEN_ID)
    greedy = torch.rand(n, generator=g) < 0.3
    return logits, ids, draft, lens, greedy


def emitted(out) -> list[list[int]]:
    return [row[: a + 1] for row, a in zip(out.token_ids.tolist(), out.num_accepted.tolist())]


@pytest.mark.parametrize("seed", range(6))
def test_greedy_accept_matches_the_padded_reference(seed):
    logits, ids, _, lens, _ = random_case(seed)
    flat_logits, p = flatten(logits, ids, None, lens)
    assert flat_logits.shape[0] == ids.shape[0] + int(lens.sum())  # only real rows
    out = greedy_accept(flat_logits, p.token_ids, p.cu_num_draft_tokens)
    assert emitted(out) == reference_greedy(logits, ids, lens)
    assert out.token_ids.shape[1] == int(lens.max()) + 1
    assert set(out.token_ids[out.token_ids < 0].tolist()) <= {PLACEHOLDER_TOKEN_ID}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("draft_kind", ["one_hot", "full"])
def test_rejection_matches_the_padded_reference(seed, draft_kind):
    logits, ids, draft, lens, greedy = random_case(100 + seed)
    q = None if draft_kind == "one_hot" else draft
    target_lp = logits.log_softmax(-1)
    seeds = [1000 * seed + i for i in range(ids.shape[0])]
    flat_lp, p = flatten(target_lp, ids, q, lens)
    out = RejectionSampler().accept(flat_lp, p.token_ids, p.cu_num_draft_tokens, p.probs, greedy,
                                    [torch.Generator().manual_seed(s) for s in seeds])
    expected = reference_rejection(target_lp, ids, q, lens, greedy, seeds)
    assert emitted(out) == expected
    # the reference rejects somewhere and accepts somewhere, so both branches are compared
    accepted = [len(r) - 1 for r in expected]
    assert any(a < int(k) for a, k in zip(accepted, lens)) and any(a > 0 for a in accepted)


def test_layout_indices():
    layout = DraftLayout.of(torch.tensor([0, 2, 2, 5]), 5)  # lens 2, 0, 3
    assert layout.lens.tolist() == [2, 0, 3]
    assert layout.token_rows.tolist() == [0, 0, 2, 2, 2]
    assert layout.logit_rows.tolist() == [0, 1, 4, 5, 6]  # decode rows: 0..2 | 3 | 4..7
    assert layout.cu_num_logits.tolist() == [0, 3, 4, 8]
    assert layout.positions.tolist() == [0, 1, 0, 1, 2]
