"""Row buckets of packed oneDNN GEMMs (speculant/model/linear/rows.py): a bounded
set of shapes (the fix for RSS growing round after round), at most 1/8 extra
rows, exact sizes for decode-sized inputs, and unchanged results."""

from __future__ import annotations

import pytest
import torch

from speculant.model.linear.onednn import OneDNNLinear, onednn_unavailable_reason
from speculant.model.linear.rows import EXACT_ROWS, bucket_rows


def test_buckets_are_few_exact_when_small_and_never_much_larger():
    assert [bucket_rows(m) for m in range(1, EXACT_ROWS + 1)] == list(range(1, EXACT_ROWS + 1))
    for m in range(1, 5000):
        b = bucket_rows(m)
        assert m <= b <= m + m // 8, (m, b)
    assert len({bucket_rows(m) for m in range(1, 513)}) == 56  # every step size up to the default budget
    assert len({bucket_rows(m) for m in range(1, 8193)}) == 16 + 8 * 9


@pytest.mark.skipif(onednn_unavailable_reason(torch.zeros(1)) is not None, reason="no oneDNN in this torch")
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 33, 100, 257])
def test_padded_forward_equals_the_dense_layer(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(48, 40, generator=gen), torch.randn(48, generator=gen)
    packed = OneDNNLinear(weight, bias)
    x = torch.randn(1, rows, 40, generator=gen)
    with torch.inference_mode():
        got = packed(x)
    assert got.shape == (1, rows, 48) and got.is_contiguous()
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
