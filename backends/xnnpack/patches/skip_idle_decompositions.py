"""``run_decompositions`` hands back a program that it would give back unchanged.

``to_edge_transform_and_lower`` retraces the whole program three times with ``run_decompositions``
(functionalize; decompose all but what XNNPACK keeps; decompose again after XNNPACK has vetted the
kept ops). On our graph the third finds nothing to rewrite but ``aten.sym_size.int``, whose
decomposition traces back to itself. Kept after measuring it (issue 11 suspected it saved only
seconds): leaving it out took XNNPACK lowering from 27.2 to 39.1 CPU s on pycode-4m and from 111.5
to 132.1 on the Llama-3.2-1B shape (android-arm64, untuned; one run each on a shared machine).

Upstream: ``_gen_edge_manager_for_partitioners`` in ``executorch/exir/program/_program.py`` already
skips the second call this way on its other branch (``contains_any_call_fn_target_op``), not the
third; pytorch/executorch#18496 ("Skip redundant run_decompositions when no ops match decomp
table", open) does it for every call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .guard import FIRED

NAME = "skip_idle_decompositions"
VERIFIED_ON = {"executorch": "1.5.1", "torch": "2.13.0"}

# Ops whose decomposition retraces to the op itself: their presence alone is no reason to retrace.
SELF_DECOMPOSING = ("aten.sym_size.int",)


def idle(program: Any, table: dict[Any, Any] | None) -> bool:
    """Whether ``run_decompositions(table)`` would give ``program`` back as it is: the graph is
    already functional (no op mutates its inputs) and no op in it has a decomposition to apply."""
    import torch

    if not table:
        return False  # the functionalizing call
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            return False
        if target in table and str(target) not in SELF_DECOMPOSING:
            return False
    return True


@contextmanager
def apply() -> Iterator[None]:
    """While active, ``run_decompositions`` returns an ``idle`` program unchanged."""
    from torch.export import ExportedProgram

    stock = ExportedProgram.run_decompositions

    def run_decompositions(self: Any, decomp_table: Any = None, *args: Any, **kwargs: Any) -> Any:
        if idle(self, decomp_table):
            FIRED[NAME] += 1
            return self
        return stock(self, decomp_table, *args, **kwargs)

    ExportedProgram.run_decompositions = run_decompositions  # type: ignore[method-assign]
    try:
        yield
    finally:
        ExportedProgram.run_decompositions = stock  # type: ignore[method-assign]
