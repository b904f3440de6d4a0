"""A fixed intra-op thread count for stages whose floating-point result depends on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def fixed_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` for the block: float sums depend on it, and
    the same inputs must give the same plan on any machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
