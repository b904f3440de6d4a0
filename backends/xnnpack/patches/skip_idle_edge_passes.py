"""Three of ExecuTorch's edge-dialect passes hand back a graph that has none of their ops unchanged.

Turning the program into the edge dialect runs ExecuTorch's own passes over the whole graph, each a
full retrace. Three of them rewrite single ops that our graphs do not have by then: ``aten.t``
(``NormalizeTransposePass``), view ops (``ReplaceBrokenOpsWithFunctionalOpsPass``, after the
view-to-copy pass), ops that take a memory format (``MemoryFormatOpsPass``). Kept after
measuring it (issue 11 suspected it saved only seconds): leaving it out took XNNPACK lowering from
27.2 to 33.5 CPU s on pycode-4m and from 111.5 to 144.0 on the Llama-3.2-1B shape (android-arm64,
untuned; one run each on a shared machine).

Upstream: the pass lists are ``base_pre_op_replace_passes`` in ``executorch/exir/passes/__init__.py``
and ``_generate_edge_program`` in ``executorch/exir/program/_program.py``; pytorch/executorch#21702
(``targeted_ops`` for these passes) and #18497 (fast-copy of the nodes a pass does not target), both
open, would make the retrace cheap instead of skipping it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .guard import FIRED

NAME = "skip_idle_edge_passes"
VERIFIED_ON = {"executorch": "1.5.1", "torch": "2.13.0"}


def _triggers() -> dict[type, Callable[[Any], bool]]:
    """Edge pass -> whether a node is one its ``call_operator`` rewrites (else it copies it)."""
    import torch
    from executorch.exir.passes.dim_order_ops_registry import DimOrderOpsMap
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import (
        ReplaceBrokenOpsWithFunctionalOpsPass,
    )

    return {
        NormalizeTransposePass: lambda t: t == torch.ops.aten.t.default,
        ReplaceBrokenOpsWithFunctionalOpsPass: lambda t: bool(getattr(t, "is_view", False)),
        MemoryFormatOpsPass: lambda t: t in DimOrderOpsMap,
    }


@contextmanager
def apply() -> Iterator[None]:
    """While active, the passes above hand back a graph that has none of their ops unchanged."""
    from torch.fx import GraphModule
    from torch.fx.passes.infra.pass_base import PassResult

    patched: list[tuple[type, Any]] = []
    for cls, fires_on in _triggers().items():
        stock = cls.__call__

        def call(self: Any, gm: Any, stock: Any = stock, fires_on: Any = fires_on) -> Any:
            nested = any(isinstance(m, GraphModule) for m in gm.children())  # control flow: look inside
            if nested or any(n.op == "call_function" and fires_on(n.target) for n in gm.graph.nodes):
                return stock(self, gm)
            FIRED[NAME] += 1
            return PassResult(gm, False)

        patched.append((cls, stock))
        cls.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, stock in patched:
            cls.__call__ = stock  # type: ignore[method-assign]
