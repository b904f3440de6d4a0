"""GPTQ onto the XNNPACK grids: round-to-nearest where the Hessian says nothing, torchao's tensor
layout, and less output error than round-to-nearest where it does."""

from __future__ import annotations

import pytest
import torch

from exporter.quant.configs import quantized_weight
from exporter.quant.gptq import proxy_loss, solve, to_torchao
from exporter.recipe import LinearQuant

INT4 = LinearQuant()
INT8 = LinearQuant(scheme="8da8w", group_size=0)


def weight(rows: int = 48, cols: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
@pytest.mark.parametrize("q", [INT4, INT8], ids=["8da4w", "8da8w"])
def test_identity_hessian_is_torchaos_round_to_nearest(q: LinearQuant, act_order: bool) -> None:
    w = weight()
    eye = torch.eye(w.shape[1]) * torch.linspace(1, 2, w.shape[1])  # a diagonal to order by
    ours = to_torchao(solve(w, eye, q, act_order=act_order), q, torch.float32)
    theirs = quantized_weight(w, q)
    assert torch.equal(ours.qdata, theirs.qdata)  # type: ignore[attr-defined]
    assert torch.equal(ours.scale, theirs.scale)  # type: ignore[attr-defined]
    assert ours.scale.dtype == theirs.scale.dtype  # type: ignore[attr-defined]
    assert torch.equal(ours.zero_point, theirs.zero_point)  # type: ignore[attr-defined]
    assert ours.block_size == theirs.block_size  # type: ignore[attr-defined]
    assert ours.activation_quantization == theirs.activation_quantization  # type: ignore[attr-defined]
    x = torch.randn(3, w.shape[1])
    assert torch.equal(torch.nn.functional.linear(x, ours), torch.nn.functional.linear(x, theirs))


def test_correlated_inputs_leave_less_output_error_than_round_to_nearest() -> None:
    g = torch.Generator().manual_seed(1)
    mix = torch.randn(128, 128, generator=g) * 0.3 + torch.eye(128)
    x = torch.randn(2048, 128, generator=g) @ mix  # inputs with correlated features, as real ones
    h = x.T @ x
    w = weight()
    rtn = solve(w, torch.eye(128), INT4).dequantize()
    gptq = solve(w, h, INT4).dequantize()
    assert proxy_loss(w, gptq, h) < 0.8 * proxy_loss(w, rtn, h)
    ordered = solve(w, h, INT4, act_order=True).dequantize()
    assert proxy_loss(w, ordered, h) < 0.8 * proxy_loss(w, rtn, h)
    clipped = solve(w, torch.eye(128), INT4, clip_search=True).dequantize()
    assert proxy_loss(w, clipped, torch.eye(128)) < proxy_loss(w, rtn, torch.eye(128))  # RTN + search
    # the proxy is the output error on those inputs
    measured = float(((x @ (w - gptq).T) ** 2).sum())
    assert measured == pytest.approx(proxy_loss(w, gptq, h), rel=1e-3)


def test_dead_inputs_and_singular_hessians_are_handled() -> None:
    x = torch.randn(64, 128)
    x[:, 5] = 0  # never active on the calibration text
    x[:, 7] = x[:, 6]  # a duplicated feature makes H singular
    w = weight()
    for act_order in (False, True):
        out = solve(w, x.T @ x, INT4, act_order=act_order)
        assert out.codes.shape == w.shape and torch.isfinite(out.dequantize()).all()
        assert (out.codes[:, 5] == 0).all()


@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
def test_clip_search_never_rounds_a_group_worse_than_its_absolute_maximum(act_order: bool) -> None:
    # Inputs of very different energy: the search weighs every weight alike whatever its input
    # (the energy-weighted search fitted the calibration text), so with no correlation between
    # inputs (a diagonal Hessian: GPTQ is round to nearest) each group's own rounding error falls or
    # stays, and falls for some groups.
    w = weight()
    h = torch.diag(torch.logspace(-3, 3, w.shape[1]))
    rows, groups = w.shape[0], w.shape[1] // INT4.group_size

    def group_error(q: torch.Tensor) -> torch.Tensor:
        return (w - q).square().view(rows, groups, -1).sum(-1)

    plain = group_error(solve(w, h, INT4, act_order=act_order).dequantize())
    searched = group_error(solve(w, h, INT4, act_order=act_order, clip_search=True).dequantize())
    assert (searched <= plain * (1 + 1e-6)).all()
    assert (searched < plain * 0.99).any()
