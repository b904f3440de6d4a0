"""What every fuzz test checks of a loader, and how many cases each target ran.

A loader given any input either returns or raises one ``ExporterError`` that names a file and fits on
one line (the CLI prints it as ``error: <path>: <message>``). Any other exception escapes the CLI as a
traceback, so it fails the test."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.errors import ExporterError

T = TypeVar("T")

# target -> cases run in this session; printed at the end of the run (tests/fuzz/conftest.py)
CASES: Counter[str] = Counter()
# FUZZ_SCALE=10 (with HYPOTHESIS_PROFILE=explore) runs ten times the cases CI runs
SCALE = int(os.environ.get("FUZZ_SCALE", "1"))


def expect_clean(call: Callable[[], T]) -> T | ExporterError:
    """The loader's result, or the project error it raised after checking that error's shape."""
    try:
        return call()
    except ExporterError as e:
        assert e.path is not None, f"error names no file: {e}"
        # the message is ours; the path is the user's own name for the file, printed as given
        assert not any(c in e.message for c in "\n\r"), f"error is not one line: {e!r}"
        return e


def fuzz(target: str, examples: int, strategy: st.SearchStrategy[T], check: Callable[[T], None]) -> None:
    """Run ``check`` on ``examples`` generated values (settings from the loaded profile) and count them."""
    ran, examples = 0, examples * SCALE

    @settings(max_examples=examples)
    @given(strategy)
    def run(value: T) -> None:
        nonlocal ran
        ran += 1
        check(value)

    run()
    CASES[target] += ran
    # Hypothesis stops early when a strategy's space is exhausted: make sure the cases really ran
    assert ran >= examples, f"{target}: only {ran} of {examples} cases ran"


# JSON values as json.loads returns them, including what Python's json accepts beyond the standard
# (NaN, Infinity) and integers far beyond 64 bits.
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**40])
    | st.floats()
    | st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308])
    | st.text(max_size=20)
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def deep_json(depth: int) -> str:
    """A document nested deeper than Python's recursion limit allows a recursive parser to go."""
    return "[" * depth + "]" * depth


def json_text(value: Any) -> str:
    return json.dumps(value, allow_nan=True)
