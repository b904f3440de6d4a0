"""The shipped calibration text shares nothing with the texts the gate and evaluations score."""

from __future__ import annotations

import pytest

from exporter.gate.inputs import TEXTS
from exporter.recipe import TRAINING_TEXTS
from tools.texts import disjoint, paragraphs


def _read(name: str) -> str:
    return (TEXTS / f"{name}.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", TRAINING_TEXTS)
def test_every_training_text_is_disjoint_from_every_held_out_text(name: str) -> None:
    held_out = [_read(n) for n in ("prose", "code", "prose-and-code", "other-prose", "other-code")]
    assert all(len(paragraphs(t)) >= 5 for t in held_out)  # enough to compare, not vacuous
    assert disjoint(_read(name), held_out) == []


def test_the_disjointness_check_finds_a_shared_paragraph() -> None:
    prose = _read("prose")
    planted = _read("calibration") + "\n\n" + max(prose.split("\n\n"), key=len)
    assert disjoint(planted, [prose]) != []
