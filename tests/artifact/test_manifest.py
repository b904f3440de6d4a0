"""read_manifest: a manifest of this exporter's schema, or one ArtifactError naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.artifact.manifest import MANIFEST, SCHEMA_VERSION, read_manifest
from exporter.errors import ArtifactError


def test_reads_a_manifest_of_this_schema(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps({"schema_version": SCHEMA_VERSION, "model": {"name": "m"}}))
    assert read_manifest(tmp_path)["model"] == {"name": "m"}


def test_other_schema_versions_are_refused(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps({"schema_version": SCHEMA_VERSION - 1}))
    with pytest.raises(ArtifactError, match=f"this exporter reads {SCHEMA_VERSION}"):
        read_manifest(tmp_path)


def test_no_manifest(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not an artifact folder") as info:
        read_manifest(tmp_path)
    assert info.value.path == tmp_path


# Escapes the fuzz tests (tests/fuzz/test_fuzz_manifest.py) found: each was another exception before.
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[1, 2]", "expected a JSON object, got list"),  # AttributeError: 'list' has no .get
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # RecursionError from json
        ('{"schema_version": ' + "9" * 5000 + "}", "not valid JSON"),  # ValueError: int digit limit
    ],
    ids=["not-an-object", "deep-nesting", "huge-integer"],
)
def test_json_no_manifest_is(tmp_path: Path, text: str, words: str) -> None:
    (tmp_path / MANIFEST).write_text(text)
    with pytest.raises(ArtifactError, match=words) as info:
        read_manifest(tmp_path)
    assert info.value.path == tmp_path / MANIFEST


def test_folder_names_the_os_refuses(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot read"):  # OSError (name too long) before
        read_manifest(tmp_path / ("x" * 5000))
    (tmp_path / MANIFEST).mkdir()
    with pytest.raises(ArtifactError, match="cannot read"):  # a manifest.json that is a folder
        read_manifest(tmp_path)
