"""tools.head_rows on the shipped model: every ranking agrees once all rows are int8."""

from __future__ import annotations

import sys

import pytest

from exporter.gate.inputs import TEXTS
from tools import head_rows


def test_all_rows_int8_is_the_int8_head_whichever_the_ranking(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = TEXTS.parent / "pycode-4m"
    monkeypatch.setattr(sys, "argv", ["head_rows", str(shipped), "--tokens", "256", "--sizes", "64,4096"])
    head_rows.main()
    lines = capsys.readouterr().out.splitlines()
    int8 = lines[1].removeprefix("head int8 alone: ")
    some, every = lines[2], lines[3]
    assert every.startswith("4096 rows (100.0%)")
    # "lowest ids 1.0123 / 1.0456 | probability ... | p * d^2 ...": each ends in its two ratios
    rankings = [" ".join(part.split()[-3:]) for part in every.split(": ", 1)[1].split("|")]
    assert len(rankings) == 3 and all(r == int8 for r in rankings), (rankings, int8)
    assert some.startswith("64 rows") and len(some.split("|")) == 3
