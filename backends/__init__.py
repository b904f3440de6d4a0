"""Backends: each lowers an exported program to a deployable file. A recipe's ``backend`` names one.

Heavy imports (ExecuTorch, Inductor) happen inside ``lower``; importing this package is cheap.
Backends never import the model: the pipeline hands them an exported program.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.export import ExportedProgram

# step(tokens int64[1, T], input_pos int64[1]) -> logits [1, V]
Stepper = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Lowered:
    """A lowered model file and what a runtime needs to load it (goes into the manifest)."""

    path: Path
    runtime: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    name: str
    suffix: str  # ".pte" or ".pt2"

    def lower(
        self, program: ExportedProgram, metadata: dict[str, Any], out: Path, *, lean_lowering: bool = True
    ) -> Lowered:
        """``lean_lowering``: the recipe's ``export.lean_lowering``, for backends with guarded shortcuts
        through their library's internals (XNNPACK); the others have none and ignore it."""
        ...

    def load(self, path: Path) -> Stepper: ...


_REGISTRY = {"xnnpack": "backends.xnnpack", "aoti": "backends.aoti"}


def get_backend(name: str) -> Backend:
    if name not in _REGISTRY:
        raise KeyError(f"unknown backend {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    backend: Backend = importlib.import_module(_REGISTRY[name]).BACKEND
    return backend
