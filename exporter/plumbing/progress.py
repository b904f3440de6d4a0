"""Progress inside a long stage: items done, rate and time left, on stderr.

    with progress("lower", total=len(parts), unit="partition") as tick:
        for part in parts:
            ...
            tick()

On a terminal this is a tqdm bar. Anywhere else (CI logs, ``2>&1 | tee``) it is a plain line through
the ``exporter`` logger at most every ``interval`` seconds, and always for the last item:

    [lower] partition 7/31 (0.4/s, about 60 s left)
    [lower] partition 31/31 (0.5/s, done in 62 s)

Nothing is shown while the ``exporter`` logger does not pass INFO (``exporter --quiet``, and library
use where nobody configured it). ``heartbeat`` is for one opaque call whose progress cannot be counted:
its start, then a line every ``interval`` seconds with the time spent so far (the stage's own line
says when it is done).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TextIO

log = logging.getLogger("exporter")

INTERVAL_S = 10.0  # plain lines: at most one per this many seconds (and the last one)


class Tick(Protocol):
    def __call__(self, n: int = 1) -> None: ...


def rate_text(rate: float) -> str:
    """``0.42`` -> ``"0.42"``, ``3.14`` -> ``"3.1"``, ``123.4`` -> ``"123"``."""
    if rate >= 100:
        return f"{rate:.0f}"
    if rate >= 1:
        return f"{rate:.1f}"
    return f"{rate:.2g}"


def duration_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def progress_line(name: str, unit: str, count: int, total: int | None, elapsed: float) -> str:
    """``[name] unit count/total (rate/s, about ETA left)``; no ETA when the total is unknown."""
    done = f"{count}/{total}" if total is not None else f"{count}"
    figures = []
    if elapsed > 0 and count > 0:
        rate = count / elapsed
        figures.append(f"{rate_text(rate)}/s")
        if total is not None and count < total:
            figures.append(f"about {duration_text((total - count) / rate)} left")
    if total is not None and count >= total:
        figures.append(f"done in {duration_text(elapsed) if elapsed >= 10 else f'{elapsed:.1f} s'}")
    return f"[{name}] {unit} {done}" + (f" ({', '.join(figures)})" if figures else "")


class PlainLines:
    """The non-terminal reporter: a logged line per tick, throttled to one per ``interval``."""

    def __init__(
        self, name: str, total: int | None, unit: str, interval: float, clock: Callable[[], float]
    ) -> None:
        self.name, self.total, self.unit, self.interval, self.clock = name, total, unit, interval, clock
        self.start = self.last = clock()
        self.count = 0
        self.shown = 0  # the count of the last line written

    def __call__(self, n: int = 1) -> None:
        self.count += n
        now = self.clock()
        last_item = self.total is not None and self.count >= self.total
        if last_item or now - self.last >= self.interval:
            self.show(now)

    def show(self, now: float) -> None:
        log.info(progress_line(self.name, self.unit, self.count, self.total, now - self.start))
        self.last, self.shown = now, self.count

    def close(self) -> None:
        """The final count when the last line did not show it (a total that was never reached)."""
        if self.count != self.shown:
            self.show(self.clock())


def _skip(n: int = 1) -> None:
    pass


def enabled() -> bool:
    return log.isEnabledFor(logging.INFO)


@contextmanager
def progress(
    name: str,
    total: int | None = None,
    unit: str = "step",
    *,
    interval: float = INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    stream: TextIO | None = None,
) -> Iterator[Tick]:
    """A ``tick(n=1)`` that counts ``n`` more ``unit``s done of ``total`` (None: unknown) in ``name``.

    ``stream`` (default: ``sys.stderr`` now) decides terminal or not and receives the tqdm bar;
    plain lines go through the ``exporter`` logger, whose handler the CLI points at stderr.
    """
    if not enabled():
        yield _skip
        return
    stream = sys.stderr if stream is None else stream
    if _is_terminal(stream):
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        # Our own log lines (a warning mid-stage) are printed above the bar instead of through it.
        with logging_redirect_tqdm([log]), tqdm(total=total, desc=f"[{name}]", unit=unit, file=stream) as bar:
            yield bar.update
        return
    lines = PlainLines(name, total, unit, interval, clock)
    yield lines
    lines.close()


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def heartbeat(
    name: str, doing: str, *, interval: float = 30.0, clock: Callable[[], float] = time.monotonic
) -> Iterator[None]:
    """While the block runs, ``[name] doing, 1.5 min so far`` every ``interval`` seconds (a thread)."""
    if not enabled():
        yield
        return
    start = clock()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            log.info("[%s] %s, %s so far", name, doing, duration_text(clock() - start))

    log.info("[%s] %s ...", name, doing)
    thread = threading.Thread(target=beat, name=f"{name} heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
