"""The result of ``exporter verify``: one line per check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: not run, ``detail`` says why
    detail: str


@dataclass(frozen=True)
class Report:
    folder: Path
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "ok": self.ok,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }
