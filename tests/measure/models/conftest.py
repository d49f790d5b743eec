"""What every models test shares: one torch thread for the module's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # Tiny shapes gain nothing from threads, and on a busy machine OpenMP's spinning threads make each op
    # ~100× slower. Restored afterwards so other test files see torch's default.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
