"""The bfloat16 dot-product linear kernel (csrc/linear_bf16.c through DotLinear).

What is checked, over shapes off every blocking boundary (outputs not a
multiple of 16 or 32, an odd number of 16-row blocks, inputs past the 12-row
pass, strided and leading-dim inputs, with and without bias, 1 and 2 threads):

* accuracy against a float64 reference: the kernel's only errors are float32
  accumulation (bounded by K * 2^-23 * sum |w x|, the float32 round-off of a
  K-term sum) and the final rounding to bfloat16 (half an ulp, 2^-9 relative);
  a layout or indexing bug gives errors of order 1;
* the fused residual add, bit for bit against torch's ``residual.add_(y)``;
* row independence, bit for bit: a row's output is the same alone, inside any
  batch, or with another thread count (the property the engine's decode versus
  verify exactness rests on);
* the layout round trip, and the refusals that name what is wrong.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_marks import needs_bf16_paths

from speculant.model.linear.backend import LinearBackendError, pack_linear_layers
from speculant.model.linear.dot_linear import DotLinear, blocked_weight, dense_weight, dot_linear_unavailable_reason

REASON = dot_linear_unavailable_reason(torch.zeros(16, 16, dtype=torch.bfloat16))
needs_kernel = needs_bf16_paths  # tests/kernel_marks.py


def _case(n: int, k: int, rows: int, bias: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.1).to(torch.bfloat16)  # [N, K]
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None  # [N]
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)  # [T, K]
    return w, b, x


def _assert_accurate(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    # y: [T, N] bfloat16; x: [T, K]; w: [N, K]; b: [N] or None
    ref = x.double() @ w.double().T + (0 if b is None else b.double())  # [T, N]
    magnitude = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    bound = ref.abs() * 2.0**-8 + magnitude * x.shape[1] * 2.0**-23 + 1e-30
    error = (y.double() - ref).abs()
    assert bool((error <= bound).all()), f"worst error / bound {(error / bound).max().item():.3f}"


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from([1, 15, 16, 17, 31, 32, 33, 48, 100, 130]), k=st.sampled_from([2, 6, 32, 62, 64, 96, 258]),
       rows=st.integers(0, 30), bias=st.booleans(), threads=st.sampled_from([1, 2]), seed=st.integers(0, 1000))
def test_accurate_and_rows_independent(n, k, rows, bias, threads, seed) -> None:
    w, b, x = _case(n, k, rows, bias, seed)
    layer = DotLinear(w, b)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = layer(x)  # [T, N]
        alone = [layer(x[i:i + 1]) for i in range(rows)]
    finally:
        torch.set_num_threads(before)
    assert y.shape == (rows, n) and y.dtype == torch.bfloat16
    if rows:
        _assert_accurate(y, x, w, b)
        assert torch.equal(torch.cat(alone), y)  # bit for bit: a row does not depend on the others
    residual = torch.randn(rows, n, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    fused = layer.add_into(x, residual.clone())  # the add inside the kernel
    assert torch.equal(fused, residual.add_(y))  # bit for bit what torch's bfloat16 add gives


@needs_kernel
@pytest.mark.parametrize("lead", [(3,), (1, 5), (2, 9)])
def test_leading_dims_and_strided_inputs(lead) -> None:
    w, b, _ = _case(70, 96, 1, True, 0)
    layer = DotLinear(w, b)
    wide = torch.randn(*lead, 200).to(torch.bfloat16)
    x = wide[..., 10:106]  # [*lead, 96], a row stride of 200: the kernel reads it in place
    y = layer(x)
    assert y.shape == (*lead, 70)
    assert torch.equal(y.reshape(-1, 70), layer(x.contiguous().reshape(-1, 96)))
    _assert_accurate(y.reshape(-1, 70), x.reshape(-1, 96), w, b)


@needs_kernel
def test_thread_count_does_not_change_bits() -> None:
    w, b, x = _case(1000, 576, 9, False, 3)
    layer = DotLinear(w, b)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = layer(x)
        torch.set_num_threads(2)
        two = layer(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_blocked_layout_round_trip() -> None:
    w = torch.randn(37, 10).to(torch.bfloat16)
    blocked = blocked_weight(w)
    assert blocked.shape == (3, 5, 16, 2)
    assert blocked[0, 1, 2, 1] == w[2, 3] and blocked[2, 4, 4, 0] == w[36, 8]
    assert bool((blocked[2, :, 5:] == 0).all())  # rows past N are zeros
    assert torch.equal(dense_weight(blocked, 37), w)


@pytest.mark.parametrize("weight, words", [
    (torch.zeros(8, 8), ["float32", "bfloat16-only"]),
    (torch.zeros(8, 7, dtype=torch.bfloat16), ["7 features", "even"]),
    (torch.zeros(8, 8, dtype=torch.bfloat16, device="meta"), ["meta", "CPU-only"]),
])
def test_unavailable_reasons_name_the_problem(weight, words) -> None:
    reason = dot_linear_unavailable_reason(weight)
    assert reason is not None and all(word in reason for word in words), reason
    with pytest.raises(ValueError, match="DotLinear cannot run this layer"):
        DotLinear(weight, None)


@needs_kernel
def test_float32_input_is_a_clear_error() -> None:
    layer = DotLinear(torch.zeros(8, 8, dtype=torch.bfloat16), None)
    with pytest.raises(TypeError, match="bfloat16 inputs, got torch.float32"):
        layer(torch.zeros(2, 8))


def test_backend_on_a_float32_model_names_option_value_reason_and_fix() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(LinearBackendError) as excinfo:
        pack_linear_layers(model, "avx512_bf16")
    message = str(excinfo.value)
    for part in ("model.linear_backend = 'avx512_bf16'", "layer '0'", "float32", "'auto'", "model.dtype = 'bfloat16'"):
        assert part in message, (part, message)
    assert type(model[0]) is torch.nn.Linear
