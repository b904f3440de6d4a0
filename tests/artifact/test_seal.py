"""Sealed JSON: intact documents pass, and every single changed byte is detected."""

from __future__ import annotations

import json
from pathlib import Path

from exporter.artifact.seal import seal_problem, sealed_bytes, write_sealed

DOC = {"schema_version": 4, "name": "pycode-4m", "figures": {"ratio": 1.0071, "ok": True}, "ids": [0, 1]}


def test_sealed_document_round_trips(tmp_path: Path) -> None:
    path = write_sealed(tmp_path / "m.json", DOC)
    raw = path.read_bytes()
    assert seal_problem(raw) is None
    data = json.loads(raw)
    assert {k: v for k, v in data.items() if k != "seal"} == DOC
    assert sealed_bytes(data) == raw  # sealing a sealed document changes nothing


def test_every_single_byte_change_is_detected() -> None:
    raw = sealed_bytes(DOC)
    for offset in range(len(raw)):
        for flip in (0x01, 0x20, 0x80):
            changed = bytearray(raw)
            changed[offset] ^= flip
            assert seal_problem(bytes(changed)) is not None, (offset, flip)


def test_reformatted_or_edited_documents_are_refused() -> None:
    raw = sealed_bytes(DOC)
    data = json.loads(raw)
    assert "bytes differ" in str(seal_problem(json.dumps(data).encode()))
    data["figures"]["ratio"] = 1.0
    assert "seal does not match" in str(seal_problem(json.dumps(data, indent=2).encode() + b"\n"))
    assert seal_problem(json.dumps(DOC).encode()) == "no seal"
