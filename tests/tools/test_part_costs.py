"""The fake-quantizers tools.part_costs measures with."""

from __future__ import annotations

import torch

from tools.part_costs import int8_tokens, round_to_grid


def test_round_to_grid_is_torchaos_symmetric_int4_group() -> None:
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    q = round_to_grid(w)
    scales = w.reshape(-1, 32).abs().amax(-1, keepdim=True) / 7
    codes = q.reshape(-1, 32) / scales
    assert torch.allclose(codes, codes.round(), atol=1e-4) and codes.abs().max() <= 8
    assert (q - w).abs().max() <= scales.max() / 2 + 1e-6


def test_int8_tokens_rounds_each_token_on_its_own_range() -> None:
    x = torch.tensor([[[0.0, 1.0, -1.0, 0.5], [100.0, -50.0, 25.0, 0.0]]])
    (y,) = int8_tokens(torch.nn.Identity(), (x,))
    steps = (x.amax(-1) - x.amin(-1)) / 255
    assert ((y - x).abs() <= steps[..., None] + 1e-6).all()  # half a step, plus the rounded zero point
    assert not torch.equal(y, x)
