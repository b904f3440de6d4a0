"""A device build of a real checkpoint in its own process, so that its recorded peak RSS is the
build's alone (the real-model tests share it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def build_in_process(
    checkpoint: Path, out: Path, *overrides: str, recipe: str = "android-arm64"
) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """Manifest, build-info and folder of ``exporter build RECIPE`` on ``checkpoint``."""
    sets = [a for o in overrides for a in ("--set", o)]
    cmd = [sys.executable, "-m", "exporter", "--quiet", "build", recipe, *sets]
    done = subprocess.run([*cmd, "--checkpoint", str(checkpoint), "--out", str(out)], check=False)
    folder = out / checkpoint.name / recipe
    assert done.returncode == 0, done.returncode
    info = json.loads((folder / "build-info.json").read_text())
    return json.loads((folder / "manifest.json").read_text()), info, folder
