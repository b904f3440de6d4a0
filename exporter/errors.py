"""Project exceptions. Each carries the file it is about, so the CLI can print one line that says
which file is wrong and what to do about it."""

from __future__ import annotations

from pathlib import Path


class ExporterError(Exception):
    """An error caused by the user's input or environment; the CLI prints it as one line, exit 2."""

    def __init__(self, path: Path | str | None, message: str) -> None:
        self.path = None if path is None else Path(path)
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path is not None else message)


class CheckpointError(ExporterError):
    """A checkpoint folder, its config, weights or tokenizer cannot be used."""


class RecipeError(ExporterError):
    """A recipe file is malformed or asks for something impossible."""


class ValidationError(ExporterError):
    """A built artifact missed the recipe's validation thresholds; nothing was published."""


class ArtifactError(ExporterError):
    """An artifact folder is missing, incomplete or cannot be loaded here."""
