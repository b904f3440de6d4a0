"""What an artifact folder holds, and the two records that describe it.

- ``manifest.json`` (sealed): everything that follows from the inputs — same checkpoint, recipe and
  tool versions give the same bytes — including ``files``, the sha256 and size of every other file
  the artifact consists of.
- ``build-info.json`` (sealed): what varies by nature between two identical builds (wall times, peak
  memory, the host, when), bound to its manifest by the manifest's sha256.
- ``model.sig`` (optional): written afterwards by ``exporter sign``; covers every other file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from pathlib import Path
from typing import Any

from ..plumbing.hashing import sha256_file
from .seal import sealed_bytes, write_sealed
from .sign import SIGNATURE

MANIFEST = "manifest.json"
BUILD_INFO = "build-info.json"
BUILD_INFO_FORMAT = "exporter-build-info/1"
# Files of a folder that ``files`` cannot list: the manifest itself, the record of the build that
# must not change the manifest's bytes, and a signature made after both.
RECORDS = (MANIFEST, BUILD_INFO, SIGNATURE)


def file_entries(folder: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file of ``folder`` but the records, by name, sorted."""
    return {
        p.name: {"sha256": sha256_file(p), "size_bytes": p.stat().st_size}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name not in RECORDS
    }


def host_facts() -> dict[str, Any]:
    import torch

    return {
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cpu_count": os.cpu_count(),
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
    }


def write_records(folder: Path, manifest: dict[str, Any], build_info: dict[str, Any]) -> Path:
    """Seal the manifest (with ``files`` filled in from the folder) and the build record beside it."""
    manifest = {**manifest, "files": file_entries(folder)}
    raw = sealed_bytes(manifest)
    (folder / MANIFEST).write_bytes(raw)
    write_sealed(
        folder / BUILD_INFO,
        {
            "format": BUILD_INFO_FORMAT,
            "manifest_sha256": hashlib.sha256(raw).hexdigest(),
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": host_facts(),
            **build_info,
        },
    )
    return folder / MANIFEST
