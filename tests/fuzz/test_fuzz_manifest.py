"""Fuzzed manifest.json files and artifact folder names, as ``read_manifest`` reads them: a manifest of
this exporter's schema or a one-line ArtifactError."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from exporter.artifact.manifest import MANIFEST, SCHEMA_VERSION, read_manifest
from exporter.errors import ArtifactError
from tests.fuzz.harness import JSON_VALUES, deep_json, expect_clean, fuzz, json_text

VERSIONS = JSON_VALUES | st.sampled_from([SCHEMA_VERSION, SCHEMA_VERSION - 1, float(SCHEMA_VERSION), True])
CONTENT = (
    st.builds(
        lambda v, rest: json_text({**rest, "schema_version": v}),
        VERSIONS,
        st.dictionaries(st.text(), JSON_VALUES),
    )
    | st.builds(json_text, JSON_VALUES)
    | st.text()
    | st.binary()
    | st.sampled_from([deep_json(100_000), '{"schema_version": ' + "9" * 5000 + "}"])
)


def test_manifest_files() -> None:
    def check(content: str | bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / MANIFEST
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
            result: Any = expect_clean(lambda: read_manifest(Path(tmp)))
            assert isinstance(result, ArtifactError) or result["schema_version"] == SCHEMA_VERSION

    fuzz("manifest: manifest.json content", 600, CONTENT, check)


def test_artifact_folder_names() -> None:
    names = st.text() | st.just("x" * 5000) | st.sampled_from(["", ".", "/", "/dev/null", MANIFEST])

    def check(name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / MANIFEST).mkdir()  # a manifest.json that is a folder, for names that reach it
            result = expect_clean(lambda: read_manifest(Path(tmp) / name))
            assert isinstance(result, ArtifactError)

    fuzz("manifest: artifact folder names", 200, names, check)
