"""The shipped calibration text shares nothing with the texts the gate and evaluations score."""

from __future__ import annotations

import pytest

from exporter.gate.inputs import TEXTS
from exporter.recipe import SELECTION_TEXTS, TRAINING_TEXTS
from tools.texts import disjoint, paragraphs


def _read(name: str) -> str:
    return (TEXTS / f"{name}.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", TRAINING_TEXTS)
def test_every_training_text_is_disjoint_from_every_held_out_text(name: str) -> None:
    judged = ("prose", "code", "prose-and-code", "other-prose", "other-code")
    held_out = [_read(n) for n in (*judged, *SELECTION_TEXTS)]
    assert all(len(paragraphs(t)) >= 5 for t in held_out)  # enough to compare, not vacuous
    assert disjoint(_read(name), held_out) == []


def test_the_disjointness_check_finds_a_shared_paragraph() -> None:
    prose = _read("prose")
    planted = _read("calibration") + "\n\n" + max(prose.split("\n\n"), key=len)
    assert disjoint(planted, [prose]) != []


@pytest.mark.parametrize("name", SELECTION_TEXTS)
def test_the_selection_texts_share_nothing_with_the_judging_texts(name: str) -> None:
    judged = [_read(n) for n in ("prose", "code", "prose-and-code", "other-prose", "other-code")]
    assert len(paragraphs(_read(name))) >= 5
    assert disjoint(_read(name), judged) == []
