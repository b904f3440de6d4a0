"""Print how many generated cases each fuzz target ran (the count CI's log shows per target)."""

from __future__ import annotations

import pytest

from tests.fuzz.harness import CASES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if CASES:
        terminalreporter.section("fuzz cases per target")
        for target, n in sorted(CASES.items()):
            terminalreporter.write_line(f"{target}: {n}")
        terminalreporter.write_line(f"total: {sum(CASES.values())}")
