"""tests/spec: run torch on one thread.

The tiny models of these tests gain nothing from a second intra-op thread,
and on a shared 2-core machine OpenMP threads spinning against other
processes made the speculative runs ~10x slower (measured: a 2000-request
sampling run took 18 s with 2 threads, 1.4 s with 1). The setting is
restored after each test, so other directories keep theirs.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _spec_one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
