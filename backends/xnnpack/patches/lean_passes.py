"""XNNPACK's ``preprocess`` runs only the graph passes that can fire on each partition.

``preprocess`` runs 17 graph passes on every partition, and each retraces the whole partition with
fake tensors whether or not it finds anything to rewrite. On a decoder, ten of them look for ops it
never has (convolution, batch norm, PReLU, bilinear upsampling, the decomposed aten SDPA pattern,
relu/hardtanh to fuse, concatenation, max pooling, matmuls that are not yet linear). A pass is
dropped for a partition only when none of the ops it rewrites occurs there, so the delegate blob is
the one the stock pass list makes (``tests/backends/test_patches.py``: byte-identical ``.pte``).

Upstream: ExecuTorch picks the pass list inside ``XnnpackBackend.preprocess``
(``backends/xnnpack/xnnpack_preprocess.py``) with no option for it. pytorch/executorch#1893 ("XNNPACK
preprocess is very very slow due to running many transform passes") names the same cost and
suggests this remedy ("we dont run unrelated transform passes"); no upstream change does it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .guard import FIRED

NAME = "lean_passes"
VERIFIED_ON = {"executorch": "1.5.1", "torch": "2.13.0"}

# Pass name -> substrings of the op names it rewrites (edge dialect, e.g. "aten.convolution.default").
ONLY_WITH_OPS: dict[str, tuple[str, ...]] = {
    "ConvertToUpsampleBilinear2d": ("upsample", "index"),
    "ConvertToSDPAPass": ("softmax", "bmm", "scaled_dot_product"),
    "FuseBatchNormPass": ("batch_norm",),
    "DecomposeBatchNorm": ("batch_norm",),
    "Conv1dUnsqueezePass": ("convolution",),
    "PReLUReshapePass": ("prelu",),
    "FuseActivationPass": ("relu", "hardtanh"),
    "DecomposeConcatenate": ("aten.cat",),
    "RemoveGetItemPass": ("max_pool2d_with_indices", "max.dim"),
    "ConvertToLinearPass": ("mm",),  # aten.mm, addmm, bmm
}


def op_names(program: Any) -> set[str]:
    """Names of the ops called in ``program``'s graph."""
    return {
        str(getattr(n.target, "__name__", n.target))
        for n in program.graph_module.graph.nodes
        if n.op == "call_function"
    }


def needed(pass_name: str, ops: set[str]) -> bool:
    patterns = ONLY_WITH_OPS.get(pass_name)
    return patterns is None or any(p in op for op in ops for p in patterns)


@contextmanager
def apply() -> Iterator[None]:
    """While active, XNNPACK's ``preprocess`` runs only the passes that can fire on each partition."""
    import executorch.backends.xnnpack.xnnpack_preprocess as preprocess

    stock = preprocess.XNNPACKPassManager

    class LeanPassManager(stock):  # type: ignore[misc, valid-type]
        def __init__(self, exported_program: Any, passes: list[Any] | None = None) -> None:
            super().__init__(exported_program, passes)
            if not passes:  # the stock list; an explicit one is left as asked
                ops = op_names(exported_program)
                stock_list: list[Any] = vars(self)["passes"]
                self.passes = [p for p in stock_list if needed(p.__name__, ops)]
                FIRED[NAME] += len(stock_list) - len(self.passes)

    preprocess.XNNPACKPassManager = LeanPassManager
    try:
        yield
    finally:
        preprocess.XNNPACKPassManager = stock
