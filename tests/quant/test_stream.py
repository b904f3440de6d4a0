"""The streamed build gives the module and reference a whole-model load + quantize gives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from exporter.build.pipeline import prepare_module, stored_bytes
from exporter.gate.validate import fp32_reference
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.quant.stream import stream_module
from exporter.recipe import load_recipe

IDS = [0, 5, 17, 300, 4095, 12, 7, 99, 1000, 3]


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("recipe_name", ["android-arm64", "server-x86-int4", "reference-fp32"])
def test_stream_equals_whole_model(
    make_checkpoint: Callable[..., Path], recipe_name: str, tied: bool
) -> None:
    ckpt = open_checkpoint(make_checkpoint(f"stream-{tied}", tie_word_embeddings=tied))
    recipe = load_recipe(recipe_name, ("export.max_seq_len=64",))
    streamed, ref = stream_module(ckpt, recipe, IDS)
    model = load_model(ckpt, 64)
    expected_ref = fp32_reference(model, IDS)
    whole = prepare_module(recipe, model)

    assert torch.equal(ref.logits, expected_ref.logits)
    got, want = streamed.state_dict(), whole.state_dict()
    assert list(got) == list(want)
    assert {k: (v.dtype, stored_bytes(v)) for k, v in got.items()} == {
        k: (v.dtype, stored_bytes(v)) for k, v in want.items()
    }
    tied_now = streamed.model.output.weight is streamed.model.tok_embeddings.weight  # type: ignore[union-attr]
    assert tied_now == (tied and recipe_name == "reference-fp32")
    with torch.no_grad():
        for tokens, pos in ((IDS, 0), ([42], len(IDS))):
            args = (torch.tensor([tokens]), torch.tensor([pos]))
            assert torch.equal(streamed(*args), whole(*args))
