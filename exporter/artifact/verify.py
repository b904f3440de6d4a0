"""``exporter verify``: is this folder exactly what a build of ours published, and does the program
still behave as it did when it was validated, here?

Checks, each reported on its own line: the manifest's seal and its JSON Schema; every file's sha256
and size against the manifest, none missing and none extra; build-info.json's seal and its binding to
the manifest; the signature (with ``--key``); that this runtime can run the program (ExecuTorch: the
program loads under ``Verification.InternalConsistency``, every operator outside the delegate and
every delegate is registered here; AOTInductor: the torch version and CPU ISA it was compiled for);
and the golden vectors, re-run. Exit codes: 0 all passed, 1 a check failed, 2 unusable input.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ArtifactError
from .folder import BUILD_INFO, BUILD_INFO_FORMAT, MANIFEST, RECORDS, file_entries
from .golden import GOLDEN
from .seal import seal_problem
from .sign import SIGNATURE, signature_problem
from .verify_types import Check, Report

EXIT_OK, EXIT_MISMATCH, EXIT_UNUSABLE = 0, 1, 2
SCHEMA = "manifest.schema.json"


def manifest_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(resources.files(__package__).joinpath(SCHEMA).read_text())
    return schema


def schema_problems(manifest: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(manifest_schema())
    errors = sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}" for e in errors]


def files_problems(folder: Path, manifest: dict[str, Any]) -> list[str]:
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        return ["manifest lists no files"]
    present = file_entries(folder)
    problems = [f"{name}: missing" for name in sorted(set(listed) - set(present))]
    problems += [f"{name}: not listed in the manifest" for name in sorted(set(present) - set(listed))]
    for name in sorted(set(listed) & set(present)):
        if present[name] != listed[name]:
            problems.append(f"{name}: sha256/size differ from the manifest")
    others = [p.name for p in folder.iterdir() if not p.is_file() and p.name not in RECORDS]
    problems += [f"{name}: unexpected non-file entry" for name in sorted(others)]
    artifact = manifest.get("artifact", {})
    if listed.get(artifact.get("file"), {}).get("sha256") != artifact.get("sha256"):
        problems.append("artifact.sha256 is not the listed model file's")
    return problems


def build_info_problem(folder: Path, manifest_bytes: bytes) -> str | None:
    path = folder / BUILD_INFO
    if not path.is_file():
        return "missing"
    raw = path.read_bytes()
    if (problem := seal_problem(raw)) is not None:
        return problem
    info = json.loads(raw)
    if info.get("format") != BUILD_INFO_FORMAT:
        return f"format {info.get('format')!r}, expected {BUILD_INFO_FORMAT!r}"
    if info.get("manifest_sha256") != hashlib.sha256(manifest_bytes).hexdigest():
        return "records another manifest (manifest_sha256 differs)"
    return None


def _run(name: str, problems: list[str], ok_detail: str) -> Check:
    return Check(name, not problems, "; ".join(problems[:5]) if problems else ok_detail)


def verify_artifact(folder: Path, public_key: Path | None = None, run_program: bool = True) -> Report:
    """Every check on ``folder``; raises ``ArtifactError`` only for input that cannot be checked."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise ArtifactError(folder, "not an artifact folder (no manifest.json)")
    if public_key is not None and not Path(public_key).is_file():
        raise ArtifactError(public_key, "key file not found")
    raw = (folder / MANIFEST).read_bytes()
    problem = seal_problem(raw)
    checks = [Check("manifest seal", problem is None, problem or "intact")]
    if problem is not None:
        skipped = Check("the rest", None, "not checked: the manifest itself cannot be trusted")
        return Report(folder, (*checks, skipped))
    manifest = json.loads(raw)
    checks.append(_run("manifest schema", schema_problems(manifest), f"valid ({SCHEMA}, version 4)"))
    files = files_problems(folder, manifest)
    checks.append(_run("files", files, f"{len(manifest['files'])} files match their sha256 and size"))
    info = build_info_problem(folder, raw)
    checks.append(Check(BUILD_INFO, info is None, info or "intact, records this manifest"))
    if public_key is not None:
        sig = signature_problem(folder, Path(public_key))
        checks.append(Check("signature", sig is None, sig or f"valid for {Path(public_key).name}"))
    elif (folder / SIGNATURE).exists():
        checks.append(Check("signature", None, "present, not checked (give --key PUBLIC.pem)"))
    if not run_program:
        return Report(folder, tuple(checks))
    if files or checks[1].ok is False:
        checks.append(Check("program", None, "not run: the files do not match the manifest"))
        return Report(folder, tuple(checks))
    from .compat import golden_check, runtime_checks

    checks += runtime_checks(folder, manifest)
    if all(c.ok is not False for c in checks):
        checks.append(golden_check(folder, manifest, json.loads((folder / GOLDEN).read_bytes())))
    else:
        checks.append(Check("golden vectors", None, "not run: this runtime cannot run the program"))
    return Report(folder, tuple(checks))
