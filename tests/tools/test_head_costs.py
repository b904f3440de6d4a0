"""The KL tools.head_costs reports."""

from __future__ import annotations

import torch

from tools.head_costs import head_kl
from tools.part_costs import round_to_grid


def test_head_kl_is_zero_for_the_same_head_and_grows_with_coarser_grids() -> None:
    g = torch.Generator().manual_seed(0)
    head, hidden = torch.randn(300, 64, generator=g), 3 * torch.randn(20, 64, generator=g)
    assert abs(head_kl(hidden, head, head, lambda t: t)) < 1e-4
    int8 = head_kl(hidden, head, round_to_grid(head, bits=8, group=64), lambda t: t)
    int4 = head_kl(hidden, head, round_to_grid(head), lambda t: t)
    assert 0 < int8 < int4
