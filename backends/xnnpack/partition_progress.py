"""Progress of XNNPACK's ``preprocess``, the slow part of lowering (5 to 6 minutes on 30 layers).

ExecuTorch hands all partitions of the program to ``XnnpackBackend.preprocess_multimethod`` at once
(``exir/backend/backend_api.py``, ``lower_all_submodules_to_backend``, ExecuTorch 1.5.1), which calls
``preprocess`` on each in turn: the first gives the total, the second the ticks
(``exporter/progress.py``: ``[lower] partition 7/31 (0.4/s, about 60 s left)``). Both wrappers only
call through, so the program is the same, byte for byte (``tests/backends/test_xnnpack.py``).

Verified on ExecuTorch 1.5.1 (``VERIFIED_ON``): on any other version the wrappers are not installed
and lowering runs as stock, without the per-partition lines. Off switch: ``EXPORTER_PARTITION_PROGRESS=0``
(``exporter --quiet`` silences the lines but keeps the call-through wrappers).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

from exporter.plumbing.progress import Tick, progress

VERIFIED_ON = "1.5.1"  # executorch
OFF_SWITCH = "EXPORTER_PARTITION_PROGRESS"


def enabled() -> bool:
    """Installed only on the ExecuTorch it was verified on, and unless switched off."""
    if os.environ.get(OFF_SWITCH, "1") == "0":
        return False
    if metadata.version("executorch") != VERIFIED_ON:
        logging.getLogger("exporter").debug(
            "partition progress verified on executorch %s only; lowering without it", VERIFIED_ON
        )
        return False
    return True


@contextmanager
def partition_progress() -> Iterator[None]:
    """While active, each XNNPACK partition preprocessed is a tick of the ``lower`` progress."""
    if not enabled():
        yield
        return
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    own_multimethod = vars(XnnpackBackend).get("preprocess_multimethod")  # None: BackendDetails'
    own_preprocess = vars(XnnpackBackend)["preprocess"]  # a staticmethod
    preprocess_all = XnnpackBackend.preprocess_multimethod.__func__
    preprocess_one = XnnpackBackend.preprocess
    ticks: list[Tick] = []  # the active report, while preprocess_multimethod runs

    def preprocess(program: Any, compile_specs: Any) -> Any:
        result = preprocess_one(program, compile_specs)
        if ticks:
            ticks[-1]()
        return result

    def preprocess_multimethod(cls: type, edge_programs: dict[str, list[Any]], compile_specs: Any) -> Any:
        total = sum(len(programs) for programs in edge_programs.values())
        with progress("lower", total=total, unit="partition") as tick:
            ticks.append(tick)
            try:
                return preprocess_all(cls, edge_programs, compile_specs)
            finally:
                ticks.pop()

    XnnpackBackend.preprocess = staticmethod(preprocess)
    XnnpackBackend.preprocess_multimethod = classmethod(preprocess_multimethod)
    try:
        yield
    finally:
        XnnpackBackend.preprocess = own_preprocess
        if own_multimethod is None:
            del XnnpackBackend.preprocess_multimethod
        else:
            XnnpackBackend.preprocess_multimethod = own_multimethod
