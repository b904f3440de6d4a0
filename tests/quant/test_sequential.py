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
