"""The vocabulary stage of the streamed tuning: KL over vocabulary blocks, the head solved in row blocks."""

from __future__ import annotations

import torch

from exporter.gate.reference import HEAD_ROWS
from exporter.quant.gptq import solve
from exporter.quant.vocabulary import head_blocks, mean_kl, row_costs, solve_head
from exporter.recipe import LinearQuant, StreamedGptq


def test_kl_over_vocabulary_blocks_is_the_whole_softmax_kl() -> None:
    """Three blocks of HEAD_ROWS entries (the last one short) give the KL of the full softmaxes."""
    g = torch.Generator().manual_seed(0)
    vocab, dim = 2 * HEAD_ROWS + 123, 16
    a, b = torch.randn(vocab, dim, generator=g), torch.randn(vocab, dim, generator=g)
    xs = [torch.randn(1, 5, dim, generator=g), torch.randn(1, 3, dim, generator=g)]
    ys = [x + 0.1 * torch.randn(x.shape, generator=g) for x in xs]
    blocked = mean_kl(
        head_blocks(lambda i, j: a[i:j], vocab, lambda t: t),
        head_blocks(lambda i, j: b[i:j], vocab, lambda t: 2 * t),
        xs,
        ys,
    )
    p = torch.log_softmax(torch.cat(xs, 1)[0] @ a.T, -1)
    q = torch.log_softmax(2 * (torch.cat(ys, 1)[0] @ b.T), -1)
    assert abs(blocked - float((p.exp() * (p - q)).sum(-1).mean())) < 1e-4


def test_the_head_solved_in_row_blocks_is_the_whole_head_solved_at_once() -> None:
    """Rows are independent given the Hessian: solving HEAD_ROWS at a time into one preallocated
    result (the last block short) is the solve of the whole matrix, codes and scales alike."""
    g = torch.Generator().manual_seed(0)
    head = torch.randn(HEAD_ROWS + 37, 64, generator=g).to(torch.bfloat16)
    x = torch.randn(256, 64, generator=g) * torch.linspace(0.1, 3.0, 64)
    hessian = x.T @ x
    q = LinearQuant(scheme="8da4w", group_size=32)
    settings = StreamedGptq(act_order=True, clip_search=True)
    blocked = solve_head(head, hessian, q, settings)
    whole = solve(head.float(), hessian, q, act_order=True, clip_search=True)
    assert torch.equal(blocked.codes, whole.codes) and torch.equal(blocked.scales, whole.scales)
    assert blocked.codes.dtype == torch.int8 and blocked.codes.shape == head.shape


def test_a_rows_cost_is_its_probability_times_its_squared_logit_error() -> None:
    """Over vocabulary blocks: the sum over positions of p * d^2; a row no position gives
    probability to costs nothing however wrong its logit, a likely row's error costs."""
    g = torch.Generator().manual_seed(0)
    vocab, dim = HEAD_ROWS + 50, 8
    a = torch.randn(vocab, dim, generator=g)
    a[7] = 0.0
    a[7, 0] = 10.0  # entry 7: likely wherever x[0] > 0
    a[9] = -a[7]  # entry 9: unlikely there
    b = a.clone()
    b[9] += 5.0
    xs = [torch.randn(1, 6, dim, generator=g).abs() + 0.5, torch.randn(1, 4, dim, generator=g).abs() + 0.5]
    error = b.clone()
    error[7] += 0.1
    costs = row_costs(
        head_blocks(lambda i, j: a[i:j], vocab, lambda t: t),
        head_blocks(lambda i, j: error[i:j], vocab, lambda t: t),
        xs,
    )
    x = torch.cat(xs, 1)[0]
    p = torch.softmax(x @ a.T, -1)
    expected = (p * (x @ error.T - x @ a.T) ** 2).sum(0)
    assert torch.allclose(costs, expected, rtol=1e-4, atol=1e-9)
    assert costs.argmax() == 7 and costs[9] < 1e-4 * costs[7]
