"""The streamed fp32 reference is the whole model's, window for window."""

from __future__ import annotations

from pathlib import Path

import torch

from exporter.gate.reference import streamed_logits
from exporter.gate.validate import full_logits
from exporter.model.checkpoint import load_model, open_checkpoint


def test_streamed_logits_equal_the_whole_models(tiny_checkpoint: Path) -> None:
    ckpt = open_checkpoint(tiny_checkpoint)
    windows = [list(range(1, 40)), list(range(50, 70))]
    streamed = list(streamed_logits(ckpt, windows))
    model = load_model(ckpt, 64)
    for window, got in zip(windows, streamed, strict=True):
        model.reset_cache()
        torch.testing.assert_close(got, full_logits(model, window), rtol=1e-5, atol=1e-5)
