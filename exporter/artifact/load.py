"""An artifact folder's model file, loaded in the runtime of the backend that built it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends import Stepper, get_backend

from .manifest import check_torch_matches, listed_file


def load_artifact(folder: Path, manifest: dict[str, Any]) -> Stepper:
    """The artifact's model file as a stepper, in the runtime of the backend that built it."""
    model_file = listed_file(folder, manifest, "artifact")
    check_torch_matches(manifest, model_file)
    return get_backend(manifest["recipe"]["resolved"]["backend"]).load(model_file)
