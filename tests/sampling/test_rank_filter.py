"""Top-k / top-p looked for among each row's most likely tokens (``CANDIDATES``)
keeps what sorting the whole vocabulary keeps."""

from __future__ import annotations

import pytest
import torch

from speculant.sampling import logits_processing as lp


def _batch(seed: int, vocab: int, rows: int = 6) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(rows, 1, generator=g) * 12 + 0.05  # from nearly flat (nucleus past the candidates) to peaked
    logits = torch.randn(rows, vocab, generator=g) * scale
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.3, 1.0, 0.9])[:rows]
    top_k = torch.randint(1, 2 * lp.CANDIDATES, (rows,), generator=g) * (torch.rand(rows, generator=g) < 0.5)
    top_p = torch.where(torch.rand(rows, generator=g) < 0.7, torch.rand(rows, generator=g), torch.ones(rows))
    return logits, temperature, top_k, top_p, torch.zeros(rows)


def _full_sort(*args: torch.Tensor) -> torch.Tensor:
    save = lp.CANDIDATES
    lp.CANDIDATES = 1 << 30  # every row sorts its whole vocabulary
    try:
        return lp.filtered_logprobs(*args)
    finally:
        lp.CANDIDATES = save


@pytest.mark.parametrize("seed", range(40))
def test_candidates_keep_what_the_full_sort_keeps(seed: int) -> None:
    args = _batch(seed, vocab=[300, 1000, 4099][seed % 3])
    got, want = lp.filtered_logprobs(*args), _full_sort(*args)
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    torch.testing.assert_close(got[torch.isfinite(got)], want[torch.isfinite(want)], rtol=0, atol=1e-5)


def test_the_batch_covers_both_paths() -> None:
    """The cases above include rows whose cut lies past the candidates (the full sort)
    and rows cut among them; counted here so that the comparison cannot pass vacuously."""
    past = among = 0
    for seed in range(40):
        logits, temperature, top_k, top_p, _ = _batch(seed, vocab=[300, 1000, 4099][seed % 3])
        kept = torch.isfinite(_full_sort(logits, temperature, top_k, top_p, torch.zeros(len(logits))))
        filtering = ((top_k > 0) | (top_p < 1)) & (temperature > 0)
        past += int((filtering & (kept.sum(-1) > lp.CANDIDATES)).sum())
        among += int((filtering & (kept.sum(-1) <= lp.CANDIDATES)).sum())
    assert past >= 5 and among >= 20


def test_ties_at_the_cut_keep_as_many_tokens_of_the_same_values() -> None:
    """bfloat16 logits tie often; which of the tied tokens survive is the selection's
    choice, but how many survive, and their values, are what the full sort keeps."""
    for seed in range(30):
        logits, temperature, top_k, top_p, min_p = _batch(seed, vocab=2048)
        args = (logits.bfloat16().float(), temperature, top_k, top_p, min_p)
        got, want = lp.filtered_logprobs(*args), _full_sort(*args)
        assert torch.equal(torch.isfinite(got).sum(-1), torch.isfinite(want).sum(-1))
        for g, w in zip(got, want):
            torch.testing.assert_close(g[torch.isfinite(g)].sort().values, w[torch.isfinite(w)].sort().values,
                                       rtol=0, atol=1e-5)


def test_a_row_is_filtered_alike_whatever_else_is_in_the_batch() -> None:
    logits, temperature, top_k, top_p, min_p = _batch(7, vocab=4099)
    together = lp.filtered_logprobs(logits, temperature, top_k, top_p, min_p)
    for r in range(len(logits)):
        alone = lp.filtered_logprobs(logits[r:r + 1], temperature[r:r + 1], top_k[r:r + 1], top_p[r:r + 1],
                                     min_p[r:r + 1])
        assert torch.equal(alone[0], together[r])
