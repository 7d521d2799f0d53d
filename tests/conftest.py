"""Suite-wide test settings."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One intra-op thread for the whole test session: on a small shared machine two OpenMP
    threads that wait for each other make the tiny test models ~10x slower (measured 1.3 s vs
    14.7 s). Timings are not asserted anywhere; this only keeps the suite short."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
