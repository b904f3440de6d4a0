"""Each partition's program is copied for XNNPACK's ``preprocess`` without copying its weights.

Before ``preprocess``, ExecuTorch deep-copies every partition's program, weights included, all
partitions at once ("in case backends change graph inside preprocess"): on a 1B model a second
1.3 GB of int8 codes, half of the lowering stage's peak. ExecuTorch leaves the copy to the backend
(``BackendDetails.copy_exported_program_for_preprocess``); this one still copies each graph and its
containers but hands the copy the same weight tensors. XNNPACK's passes replace constants rather
than write into them; the byte-identical test covers this too.

Upstream: the copy is made in ``exir/backend/backend_api.py`` (``lower_all_submodules_to_backend``
via ``copy_exported_program_for_preprocess``); pytorch/executorch#4311 ("Retire deep copy of
edge_program in to_backend method") proposed dropping it and was closed unmerged.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .guard import FIRED

NAME = "shared_weights"
VERIFIED_ON = {"executorch": "1.5.1", "torch": "2.13.0"}


@contextmanager
def apply() -> Iterator[None]:
    """While active, each partition's program is deep-copied for ``preprocess`` except its weights
    and constants (tensors, and the few script objects ``constants`` may hold), which are shared."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    own = "copy_exported_program_for_preprocess" in vars(XnnpackBackend)
    stock = vars(XnnpackBackend).get("copy_exported_program_for_preprocess")

    def copy_sharing_weights(cls: type, program: Any, compile_specs: list[Any]) -> Any:
        tensors = [*program.state_dict.values(), *program.constants.values()]
        FIRED[NAME] += 1
        return copy.deepcopy(program, {id(t): t for t in tensors})

    XnnpackBackend.copy_exported_program_for_preprocess = classmethod(copy_sharing_weights)
    try:
        yield
    finally:
        if own:
            XnnpackBackend.copy_exported_program_for_preprocess = stock
        else:
            del XnnpackBackend.copy_exported_program_for_preprocess
