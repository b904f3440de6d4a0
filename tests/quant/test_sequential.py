"""Streamed GPTQ's choice of embedding and head precision by their measured cost."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.build.pipeline import prepare
from exporter.quant.sequential import gptq_module

SMALL = (
    "quantization.gptq.windows=4",
    "quantization.gptq.window_tokens=64",
    "quantization.gptq.measure_windows=2",
)


def vocabulary(checkpoint: Path, *overrides: str) -> dict[str, object]:
    inputs = prepare("android-arm64", checkpoint, None, (*SMALL, *overrides))
    assert inputs.calibration is not None
    _, _, record = gptq_module(inputs.checkpoint, inputs.recipe, inputs.gate.ids, inputs.calibration[0])
    vocab: dict[str, object] = record["gptq"]["vocabulary"]
    return vocab


@pytest.mark.parametrize("budget", [None, 0.0])
def test_embedding_and_head_go_8_bit_only_over_their_budget(
    tiny_checkpoint: Path, budget: float | None
) -> None:
    overrides = (
        ()
        if budget is None
        else (f"quantization.gptq.embedding_max_kl={budget}", f"quantization.gptq.head_max_kl={budget}")
    )
    vocab = vocabulary(tiny_checkpoint, *overrides)
    assert isinstance(vocab["embedding_kl"], float) and vocab["embedding_kl"] > 0
    assert isinstance(vocab["head_kl"], float) and vocab["head_kl"] > 0
    bits = 4 if budget is None else 8
    assert (vocab["embedding_bits"], vocab["head_bits"]) == (bits, bits)
    if budget is not None:  # the int8 head is measured too, and costs less than the int4 one
        assert isinstance(vocab["head_kl_int8"], float) and vocab["head_kl_int8"] < vocab["head_kl"]


def test_kl_over_vocabulary_blocks_is_the_whole_softmax_kl() -> None:
    """Three blocks of HEAD_ROWS entries (the last one short) give the KL of the full softmaxes."""
    import torch

    from exporter.gate.reference import HEAD_ROWS
    from exporter.quant.sequential import head_blocks, mean_kl

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
    import torch

    from exporter.gate.reference import HEAD_ROWS
    from exporter.quant.gptq import solve
    from exporter.quant.sequential import solve_head
    from exporter.recipe import LinearQuant, StreamedGptq

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


def int8_choice(checkpoint: Path, *overrides: str) -> list[dict[str, object]]:
    inputs = prepare("android-arm64", checkpoint, None, (*SMALL, *overrides))
    assert inputs.calibration is not None
    _, _, record = gptq_module(inputs.checkpoint, inputs.recipe, inputs.gate.ids, inputs.calibration[0])
    blocks: list[dict[str, object]] = record["gptq"]["blocks"]
    return blocks


def test_an_error_target_raises_more_linears_only_within_its_cap(tiny_checkpoint: Path) -> None:
    ratio = "quantization.gptq.int8_size_ratio=1.1"
    base = int8_choice(tiny_checkpoint, ratio)
    # a target no block meets: every block raises more, up to the cap
    strict = int8_choice(tiny_checkpoint, ratio, "quantization.gptq.int8_error_target=1e-12")
    # the same target with no room past the ratio, and a target every block meets: nothing changes
    capped = int8_choice(
        tiny_checkpoint,
        ratio,
        "quantization.gptq.int8_error_target=1e-12",
        "quantization.gptq.int8_max_ratio=1.1",
    )
    loose = int8_choice(tiny_checkpoint, ratio, "quantization.gptq.int8_error_target=1.0")
    assert capped == base and loose == base
    # the first block sees the same inputs in both builds (later ones see their own quantized
    # predecessors'): it keeps its choice, adds to it and ends closer to its fp32 output
    first, first_strict = base[0], strict[0]
    assert isinstance(first["int8"], list) and isinstance(first_strict["int8"], list)
    assert set(first["int8"]) < set(first_strict["int8"])
    assert isinstance(first["error"], float) and isinstance(first_strict["error"], float)
    assert first_strict["error"] < first["error"]

    def count(blocks: list[dict[str, object]]) -> int:
        return sum(len(b["int8"]) for b in blocks if isinstance(b["int8"], list))

    assert count(strict) > count(base)
