"""What every lowering patch shares: the version check, the off switch, and the count of firings.

A patch reaches into ExecuTorch or torch internals, so it applies only on the versions its module's
``VERIFIED_ON`` names; on any other version lowering takes the stock path and says so once per
process. ``FIRED`` counts each time a patch changed what the library would have done, so a test can
show that every patch did something (and that none did when switched off).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping
from contextlib import AbstractContextManager
from importlib import metadata
from typing import Protocol

OFF_SWITCH = "EXPORTER_LEAN_LOWERING"
# patch name -> times it changed what the library would have done
FIRED: Counter[str] = Counter()
_warned: set[str] = set()  # one warning per process, however many builds it runs

log = logging.getLogger("exporter")


class Patch(Protocol):
    """A patch module: its name, the versions it was verified on, and a context that applies it."""

    @property
    def NAME(self) -> str: ...  # read-only: a module constant

    @property
    def VERIFIED_ON(self) -> Mapping[str, str]: ...

    def apply(self) -> AbstractContextManager[None]: ...


def switched_off() -> bool:
    return os.environ.get(OFF_SWITCH, "1") == "0"


def installed(dists: Mapping[str, str]) -> dict[str, str]:
    """The installed version of each distribution in ``dists``, without a local tag (``+cpu``)."""
    return {dist: metadata.version(dist).split("+")[0] for dist in dists}


def verified(patch: Patch) -> bool:
    return installed(patch.VERIFIED_ON) == dict(patch.VERIFIED_ON)


def warn_once(unverified: list[Patch]) -> None:
    """One warning per process names the patches left out and the versions they need."""
    if not unverified or _warned:
        return
    _warned.add("versions")
    found = installed({d: "" for p in unverified for d in p.VERIFIED_ON})
    log.warning(
        "[lower] lean lowering: %s verified on other versions (%s; found %s): stock lowering for them",
        ", ".join(p.NAME for p in unverified),
        "; ".join(f"{p.NAME}: {dict(p.VERIFIED_ON)}" for p in unverified),
        found,
    )
