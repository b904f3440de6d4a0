"""Progress reports: the lines, rates and estimates they give on a fake clock, and when they are quiet."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable

import pytest

from exporter.plumbing.progress import duration_text, heartbeat, progress, progress_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """The messages the ``exporter`` logger passed at INFO (as the CLI sets it without --quiet)."""
    monkeypatch.setattr(logging.getLogger("exporter"), "propagate", True)  # the CLI turns it off
    caplog.set_level(logging.INFO, logger="exporter")
    return lambda: caplog.messages


def test_plain_lines_give_rate_and_time_left_at_most_every_interval(lines: Callable[[], list[str]]) -> None:
    clock = FakeClock()
    with progress(
        "lower", total=10, unit="partition", interval=10, clock=clock, stream=io.StringIO()
    ) as tick:
        for _ in range(10):
            clock.now += 4  # a partition every 4 s: a line every third one, and the last
            tick()
    assert lines() == [
        "[lower] partition 3/10 (0.25/s, about 28 s left)",
        "[lower] partition 6/10 (0.25/s, about 16 s left)",
        "[lower] partition 9/10 (0.25/s, about 4 s left)",
        "[lower] partition 10/10 (0.25/s, done in 40 s)",
    ]


def test_an_unknown_total_gives_count_and_rate_and_the_final_count(lines: Callable[[], list[str]]) -> None:
    clock = FakeClock()
    with progress("train", unit="step", interval=5, clock=clock, stream=io.StringIO()) as tick:
        for _ in range(7):
            clock.now += 2
            tick(3)
    assert lines() == ["[train] step 9 (1.5/s)", "[train] step 18 (1.5/s)", "[train] step 21 (1.5/s)"]


def test_a_terminal_gets_a_tqdm_bar_and_no_plain_lines(lines: Callable[[], list[str]]) -> None:
    terminal = Terminal()
    with progress("load_quantize", total=3, unit="layer", stream=terminal) as tick:
        for _ in range(3):
            tick()
    bar = terminal.getvalue()
    assert "\r" in bar and "[load_quantize]" in bar and "3/3" in bar and "layer/s" in bar
    assert lines() == []


@pytest.mark.parametrize("level", [logging.WARNING, logging.NOTSET])  # --quiet; nobody configured it
def test_nothing_is_shown_unless_the_exporter_logger_passes_info(
    level: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging.getLogger("exporter"), "propagate", True)
    caplog.set_level(logging.WARNING)  # the root's default
    caplog.set_level(level, logger="exporter")
    terminal = Terminal()
    for stream in (terminal, io.StringIO()):
        with progress("lower", total=2, stream=stream) as tick:
            tick()
            tick()
        with heartbeat("lower", "compiling"):
            pass
    assert terminal.getvalue() == ""
    assert caplog.messages == []


def test_time_left_reads_in_seconds_minutes_and_hours() -> None:
    assert [duration_text(s) for s in (0.4, 89, 90, 330, 5399, 5400, 9000)] == [
        "0 s",
        "89 s",
        "1.5 min",
        "5.5 min",
        "90.0 min",
        "1.5 h",
        "2.5 h",
    ]
    assert progress_line("lower", "partition", 1, 31, 0.0) == "[lower] partition 1/31"
    assert (
        progress_line("lower", "partition", 7, 31, 17.5) == "[lower] partition 7/31 (0.4/s, about 60 s left)"
    )
    assert progress_line("train", "step", 1200, None, 10) == "[train] step 1200 (120/s)"
    assert progress_line("lower", "partition", 6, 6, 5.83) == "[lower] partition 6/6 (1.0/s, done in 5.8 s)"


def test_heartbeat_says_how_long_an_opaque_call_has_run(lines: Callable[[], list[str]]) -> None:
    clock = FakeClock()

    def later() -> float:
        clock.now += 30
        return clock.now

    with heartbeat("lower", "compiling with AOTInductor", interval=0.001, clock=later):
        deadline = time.monotonic() + 30  # a bound on waiting for the thread, not a measurement
        while len(lines()) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
    seen = lines()
    assert seen[0] == "[lower] compiling with AOTInductor ..."
    assert seen[1:3] == [
        "[lower] compiling with AOTInductor, 30 s so far",
        "[lower] compiling with AOTInductor, 60 s so far",
    ]
    time.sleep(0.01)
    assert lines() == seen  # the thread stopped with the block
