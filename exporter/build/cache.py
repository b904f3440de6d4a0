"""Reuse of finished artifacts by build key (``exporter.build.plan``). No torch until a build must run.

A finished artifact is a folder whose manifest records the job's ``build_key`` and whose model file
has the size the manifest says. It is looked for in the job's own output folder, then in
``$EXPORTER_CACHE/<key>/`` (where every published artifact is also copied when that variable is
set), from where it is copied into the output folder. Copies are published as builds are
(``exporter.artifact.publish``): under the target's lock, through a staging folder and a rename.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..artifact.manifest import MANIFEST
from ..artifact.publish import make_staging, publish, target_lock
from ..errors import ExporterError
from .plan import CACHE_ENV, Job, plan_job


@dataclass(frozen=True)
class Outcome:
    """A finished artifact found for a build: its folder and build key."""

    folder: Path
    key: str


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV)
    return Path(value) if value else None


def finished_key(folder: Path) -> str | None:
    """The build key of the finished artifact in ``folder``, or None if there is none: every file
    its manifest lists must be there at its listed size (sizes, not hashes: a lookup must not read
    gigabytes; ``exporter verify`` checks the bytes)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        artifact = manifest["artifact"]
        listed = manifest.get("files") or {artifact["file"]: {"size_bytes": artifact["size_bytes"]}}
        for name, entry in listed.items():
            if (folder / name).stat().st_size != entry["size_bytes"]:
                return None
        key = manifest.get("build_key")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return key if isinstance(key, str) else None


def _copy_into_place(source: Path, target: Path) -> None:
    """Copy a finished folder to ``target`` as a build publishes: under the target's lock, through
    a staging folder and a durable swap (``exporter.artifact.publish``)."""
    with target_lock(target):
        staging = make_staging(target)
        try:
            shutil.copytree(source, staging, dirs_exist_ok=True)
            publish(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def lookup(job: Job) -> Path | None:
    """The job's artifact folder if a finished artifact with its key is there or in the cache."""
    if finished_key(job.out) == job.key:
        return remember(job.out)  # a cache set up after the build learns it now
    cache = cache_dir()
    if cache is not None and finished_key(cache / job.key) == job.key:
        _copy_into_place(cache / job.key, job.out)
        return job.out
    return None


def reuse(
    recipe_arg: str, checkpoint: Path | None, out: Path | None, overrides: tuple[str, ...]
) -> Outcome | None:
    """The finished artifact of this build, if there is one; None means it must be built. Input
    errors are left to the build, which reports them in its own words."""
    try:
        job = plan_job(recipe_arg, checkpoint, out, overrides)
    except ExporterError:
        return None
    folder = lookup(job)
    return None if folder is None else Outcome(folder, job.key)


def remember(folder: Path) -> Path:
    """Copy a just-published artifact into ``$EXPORTER_CACHE/<key>/`` (if set); returns ``folder``."""
    cache, key = cache_dir(), finished_key(folder)
    if cache is not None and key is not None and finished_key(cache / key) != key:
        _copy_into_place(folder, cache / key)
    return folder
