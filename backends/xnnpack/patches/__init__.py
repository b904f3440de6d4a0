"""Lowering to XNNPACK without the work that changes nothing in its output: each shortcut through
ExecuTorch or torch internals is one module here, with the versions it was verified on, the count
of its firings and the upstream issue or code it works around.

``lean_lowering`` applies the verified ones, on by default (recipe key ``export.lean_lowering``;
``EXPORTER_LEAN_LOWERING=0`` switches them off for a process). Each keeps the ``.pte`` byte-identical
to the stock flow's (``tests/backends/test_patches.py``, on every shipped XNNPACK recipe's graph).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from . import (
    compact_dependencies,
    forget_graphs,
    lean_passes,
    shared_weights,
    skip_idle_decompositions,
    skip_idle_edge_passes,
)
from .guard import FIRED, OFF_SWITCH, Patch, switched_off, verified, warn_once

__all__ = ["FIRED", "OFF_SWITCH", "PATCHES", "lean_lowering"]

# In the order they are entered; ``forget_graphs`` last, so it runs once the others are undone.
PATCHES: tuple[Patch, ...] = (
    skip_idle_decompositions,
    skip_idle_edge_passes,
    lean_passes,
    shared_weights,
    compact_dependencies,
    forget_graphs,
)


def _nothing() -> None:
    return None


@contextmanager
def lean_lowering(enabled: bool = True) -> Iterator[Callable[[], None]]:
    """Applies every patch verified on the installed versions unless ``enabled`` is false or the
    off switch is set. Yields what the backend calls once the program is serialized, to let go of
    what ExecuTorch's module-level state still holds (nothing to do on the stock path)."""
    if not enabled or switched_off():
        yield _nothing
        return
    applied = [p for p in PATCHES if verified(p)]
    warn_once([p for p in PATCHES if p not in applied])
    with ExitStack() as stack:
        for patch in applied:
            stack.enter_context(patch.apply())
        yield forget_graphs.forget_graphs if forget_graphs in applied else _nothing
