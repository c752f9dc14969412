"""Tree acceptance (``sampling.tree_acceptance``): greedy takes the longest path
matching the target's argmax; sampling (multi-candidate rejection over one-hot
siblings) emits each token with exactly the target's probability.

The statistical test draws a random target distribution at every span row of a
fixed tree and checks, over N seeded decodes, the first emitted token against
the root row's distribution and the second (after each first token that is a
child of the root) against that child's row: Pearson's chi-square, passing
when p > 1e-3 (the draws are seeded, so the result is fixed). Its power: the
same test rejects (p < 1e-6) a sampler that keeps the first child outright.
"""

from __future__ import annotations

import pytest
import torch

from speculant.acceptance.rejection import RejectionSampler
from speculant.interfaces import Proposals
from speculant.plugin_api.testing.stats import chi_square_p
from speculant.sampling.tree_acceptance import greedy_tree_path, sampled_tree_path

V = 6
N = 20000
# root -> nodes 0 (token 1), 1 (token 2), 2 (token 3); node 0 -> nodes 3 (token 4), 4 (token 0); node 1 -> 5 (token 5)
TOKENS = [1, 2, 3, 4, 0, 5]
PARENTS = [-1, -1, -1, 0, 0, 1]


@pytest.mark.parametrize("argmax, path, final", [
    ([1, 4, 0, 0, 3, 3, 0], [0, 3], 3),  # root -> token 1 (node 0) -> token 4 (node 3), then the argmax at node 3
    ([2, 0, 5, 0, 0, 0, 1], [1, 5], 1),  # the second child, then its only child
    ([3, 0, 0, 2, 0, 0, 0], [2], 2),  # a leaf: the bonus token after it
    ([5, 0, 0, 0, 0, 0, 0], [], 5),  # no child matches: the argmax itself
    ([1, 2, 0, 0, 0, 0, 0], [0], 2),  # node 0's children propose 4 and 0, the target wants 2
])
def test_greedy_takes_the_longest_matching_path(argmax, path, final):
    assert greedy_tree_path(argmax, TOKENS, PARENTS) == (path, final)


def rows_of(seed: int) -> torch.Tensor:  # [1 + n, V] float64 distributions, none near one-hot
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.rand(len(TOKENS) + 1, V, generator=g, dtype=torch.float64)).softmax(-1)


def emitted(rows: torch.Tensor, accept_first: bool = False) -> torch.Tensor:  # -> [N, 2] first two tokens
    """``accept_first``: the wrong sampler that keeps the root's first child whatever the target says
    (its uniform forced to 0)."""
    gen = torch.Generator().manual_seed(0)
    out = torch.empty((N, 2), dtype=torch.long)
    for i in range(N):
        uniforms = torch.rand(len(TOKENS) + 1, generator=gen, dtype=torch.float64).tolist()
        if accept_first:
            uniforms[0] = 0.0
        path, final = sampled_tree_path(rows, TOKENS, PARENTS, uniforms)
        seq = [TOKENS[j] for j in path] + [final]
        out[i] = torch.tensor((seq + [-1])[:2])
    return out


def smallest_p(tokens: torch.Tensor, rows: torch.Tensor) -> float:
    """The smallest chi-square p-value of the first token (against the root row) and of the
    second after each first token that is a child of the root (against that child's row)."""
    worst = chi_square_p(torch.bincount(tokens[:, 0], minlength=V), rows[0])
    for node, (tok, parent) in enumerate(zip(TOKENS, PARENTS)):
        after = tokens[tokens[:, 0] == tok, 1]
        if parent == -1 and after.numel():
            worst = min(worst, chi_square_p(torch.bincount(after, minlength=V), rows[1 + node]))
    return worst


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_trees_follow_the_target(seed):
    rows = rows_of(seed)
    assert smallest_p(emitted(rows), rows) > 1e-3
    assert smallest_p(emitted(rows, accept_first=True), rows) < 1e-6, "the test cannot tell a wrong sampler apart"


def test_rejection_sampler_accepts_trees_row_by_row():
    """Through the acceptance plugin: a greedy and a sampling decode in one batch; the greedy
    one walks the argmax, the sampling one draws its ``n + 1`` uniforms from its generator only."""
    logits = torch.full((2 * (len(TOKENS) + 1), V), -5.0)
    for r, tok in enumerate([1, 4, 0, 0, 3, 3, 0]):  # decode 0 (greedy): the first argmax case above
        logits[r, tok] = 5.0
    logits[len(TOKENS) + 1:] = torch.randn(len(TOKENS) + 1, V, generator=torch.Generator().manual_seed(4))
    lp = logits.log_softmax(-1)
    proposals = Proposals(torch.tensor(TOKENS * 2), torch.tensor([0, len(TOKENS), 2 * len(TOKENS)]),
                          parents=torch.tensor(PARENTS * 2))
    gens = [torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)]
    out = RejectionSampler().accept_tree(lp, proposals, torch.tensor([True, False]), gens)
    assert out.paths[0] == [0, 3] and out.token_ids[0].tolist()[:3] == [1, 4, 3]
    uniforms = torch.rand(len(TOKENS) + 1, generator=torch.Generator().manual_seed(9), dtype=torch.float64).tolist()
    path, final = sampled_tree_path(lp[len(TOKENS) + 1:].double().exp(), TOKENS, PARENTS, uniforms)
    assert out.paths[1] == path and out.token_ids[1].tolist()[: len(path) + 1] == [TOKENS[j] for j in path] + [final]
    assert out.num_accepted.tolist() == [2, len(path)]


# ---- siblings drawn from a draft distribution (EAGLE's sampled trees) -------------------------------------------

def draft_rows(seed: int) -> torch.Tensor:  # [1 + n, V]: the draft's distribution after each span row, peaked
    g = torch.Generator().manual_seed(100 + seed)
    return (3 * torch.randn(len(TOKENS) + 1, V, generator=g, dtype=torch.float64)).softmax(-1)


def drafted(rows: torch.Tensor, q_rows: torch.Tensor, wrong: bool = False) -> torch.Tensor:  # -> [N, 2]
    """Each decode's tree (the shape of PARENTS) drawn from the draft: a node's children
    are distinct draws without replacement from its row of ``q_rows``, carried as their
    draft probs; the target's row of a node is ``rows[1 + token]`` (the target after that
    token), the root's ``rows[0]``. ``wrong``: the draft reports the uniform distribution
    instead of the one it drew from (ignoring q altogether, one-hot drafts, would stay
    lossless: a one-hot proposal may be any token)."""
    gen = torch.Generator().manual_seed(0)
    kids: dict[int, list[int]] = {}
    for j, p in enumerate(PARENTS):
        kids.setdefault(p, []).append(j)
    out = torch.empty((N, 2), dtype=torch.long)
    for i in range(N):
        tokens = [0] * len(TOKENS)
        for parent in sorted(kids):  # parents come before their children
            q = q_rows[0] if parent < 0 else q_rows[1 + tokens[parent]]
            for j, tok in zip(kids[parent], torch.multinomial(q, len(kids[parent]), generator=gen).tolist()):
                tokens[j] = tok
        target = torch.stack([rows[0]] + [rows[1 + t % len(TOKENS)] for t in tokens])  # [1 + n, V]
        draft = torch.stack([q_rows[0] if p < 0 else q_rows[1 + tokens[p]] for p in PARENTS])  # [n, V]
        uniforms = torch.rand(len(TOKENS) + 1, generator=gen, dtype=torch.float64).tolist()
        path, final = sampled_tree_path(target, tokens, PARENTS, uniforms, torch.full_like(draft, 1 / V) if wrong
                                        else draft)
        seq = [tokens[j] for j in path] + [final]
        out[i] = torch.tensor((seq + [-1])[:2])
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_trees_drawn_from_the_draft_follow_the_target(seed):
    """First token against the root's target row; the second, after each first token that was
    an accepted child, against the target's row after that token."""
    rows, q_rows = rows_of(seed), draft_rows(seed)

    def smallest(tokens: torch.Tensor) -> float:
        worst = chi_square_p(torch.bincount(tokens[:, 0], minlength=V), rows[0])
        for tok in range(V):
            after = tokens[(tokens[:, 0] == tok) & (tokens[:, 1] >= 0), 1]
            if after.numel() >= 200:
                worst = min(worst, chi_square_p(torch.bincount(after, minlength=V), rows[1 + tok % len(TOKENS)]))
        return worst

    assert smallest(drafted(rows, q_rows)) > 1e-3
    assert smallest(drafted(rows, q_rows, wrong=True)) < 1e-6, "the test cannot tell a wrong q apart"
