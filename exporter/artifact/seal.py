"""Sealed JSON: a JSON file that carries the sha256 of its own canonical bytes.

A manifest cannot list its own digest, and ``build-info.json`` is deliberately left out of the
manifest (it holds what varies between identical builds). Sealing makes a flipped byte in either
detectable without a second file: the file must be exactly the canonical serialisation of what it
parses to (so whitespace and key order are fixed), and the ``seal`` entry must be the digest of that
serialisation without the seal. Any single changed byte either breaks the JSON, changes the bytes
away from canonical, or changes the data and with it the digest.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

SEAL_KEY = "seal"


def canonical(data: dict[str, Any]) -> bytes:
    # ensure_ascii: the bytes do not depend on the locale or on how a text editor saves them
    return (json.dumps(data, indent=2, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")


def sealed_bytes(data: dict[str, Any]) -> bytes:
    """``data`` with a trailing ``seal`` entry: the sha256 of the canonical bytes without it."""
    body = {k: v for k, v in data.items() if k != SEAL_KEY}
    return canonical({**body, SEAL_KEY: {"sha256": hashlib.sha256(canonical(body)).hexdigest()}})


def seal_problem(raw: bytes) -> str | None:
    """Why ``raw`` is not an intact sealed JSON document, or None if it is."""
    try:
        data = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"not valid ASCII JSON ({e})"
    if not isinstance(data, dict) or not isinstance(data.get(SEAL_KEY), dict):
        return "no seal"
    try:
        expected = sealed_bytes(data)
    except ValueError as e:  # NaN or infinity: never written by us
        return f"not canonical JSON ({e})"
    if data[SEAL_KEY] != json.loads(expected)[SEAL_KEY]:
        return "seal does not match the content (the file was changed after the build)"
    if raw != expected:
        return "bytes differ from the sealed form (the file was changed after the build)"
    return None


def write_sealed(path: Path, data: dict[str, Any]) -> Path:
    path.write_bytes(sealed_bytes(data))
    return path
