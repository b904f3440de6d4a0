"""The fixed thread count of the tuning stages."""

from __future__ import annotations

import pytest
import torch

from exporter.plumbing.threads import fixed_threads


def test_fixed_threads_sets_the_count_and_restores_it_even_on_error() -> None:
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with fixed_threads(target):
        assert torch.get_num_threads() == target
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), fixed_threads(target):
        raise RuntimeError("stage failed")
    assert torch.get_num_threads() == before
