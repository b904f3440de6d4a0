"""Every family end to end on tiny checkpoints transformers wrote (with each family's twists): the
fp32 ``.pte`` matches transformers step by step over more positions than any window, and the device
recipe's int4 build passes its gate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from backends.xnnpack.runtime import load_pte
from exporter.build.pipeline import build
from exporter.gate.steppers import follow
from tests.model.families.parity import PARITY_TOL, SEQ, hf_logits
from tests.model.families.test_parity import FAMILIES

pytestmark = pytest.mark.slow
SMALL = ("export.max_seq_len=64", "validation.eval_tokens=48", "validation.judge_tokens=64")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_fp32_pte_matches_transformers(
    make_checkpoint: Callable[..., Path], tmp_path: Path, name: str
) -> None:
    folder = make_checkpoint(f"pte-{name}", perturb=True, **FAMILIES[name])
    artifact = build("reference-fp32", checkpoint=folder, out=tmp_path, overrides=SMALL)
    tokens = torch.randint(0, 4096, (1, SEQ), generator=torch.Generator().manual_seed(1))
    expected = hf_logits(folder, tokens)[0]
    step = load_pte(artifact / "model.pte")
    prefill = 12  # longer than the windows: the ring is exact across a prefill that wraps it
    rows = follow(step, tokens[0, :prefill].tolist(), tokens[0, prefill:].tolist())
    assert (rows - expected[prefill - 1 : SEQ - 1]).abs().max().item() <= PARITY_TOL


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_int4_device_build_passes_its_gate(
    make_checkpoint: Callable[..., Path], tmp_path: Path, name: str
) -> None:
    folder = make_checkpoint(f"int4-{name}", perturb=True, **FAMILIES[name])
    artifact = build("android-arm64", checkpoint=folder, out=tmp_path, overrides=SMALL)
    assert (artifact / "model.pte").is_file()
