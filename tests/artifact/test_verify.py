"""``exporter verify`` and ``exporter sign`` on a real built artifact (the tiny checkpoint's
reference-fp32 build): intact folders pass, every tampering is caught, exit codes as documented."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from exporter.artifact.folder import BUILD_INFO, MANIFEST
from exporter.artifact.seal import write_sealed
from exporter.artifact.verify import EXIT_MISMATCH, EXIT_OK, EXIT_UNUSABLE, verify_artifact
from exporter.cli import main
from exporter.errors import ArtifactError

FLIPS_PER_FILE = 24


@pytest.fixture
def folder(tiny_artifact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_artifact, tmp_path / "artifact"))


def key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def failed(folder: Path, **kwargs: object) -> list[str]:
    report = verify_artifact(folder, **kwargs)  # type: ignore[arg-type]
    return [c.name for c in report.checks if c.ok is False]


def test_a_published_artifact_verifies(tiny_artifact: Path) -> None:
    report = verify_artifact(tiny_artifact)
    assert report.ok, report.to_dict()
    names = [c.name for c in report.checks if c.ok]
    assert names == [
        "manifest seal",
        "manifest schema",
        "files",
        BUILD_INFO,
        "kernels",
        "delegates",
        "program",
        "golden vectors",
    ]


def test_every_flipped_byte_is_detected(folder: Path) -> None:
    rng = random.Random(0)
    tried = detected = 0
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        original = path.read_bytes()
        for offset in rng.sample(range(len(original)), min(FLIPS_PER_FILE, len(original))):
            changed = bytearray(original)
            changed[offset] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(changed))
            tried += 1
            detected += not verify_artifact(folder, run_program=False).ok
        path.write_bytes(original)
    assert tried == detected and tried >= FLIPS_PER_FILE * 4
    assert verify_artifact(folder, run_program=False).ok


def test_missing_extra_and_replaced_files_are_detected(folder: Path) -> None:
    (folder / "notes.txt").write_text("added later")
    assert failed(folder, run_program=False) == ["files"]
    (folder / "notes.txt").unlink()
    (folder / "golden.json").unlink()
    assert "files" in failed(folder, run_program=False)


def test_a_build_info_of_another_build_is_detected(folder: Path) -> None:
    info = json.loads((folder / BUILD_INFO).read_bytes())
    write_sealed(folder / BUILD_INFO, {**info, "manifest_sha256": "0" * 64})  # sealed, but not ours
    assert failed(folder, run_program=False) == [BUILD_INFO]


def test_a_reformatted_manifest_is_detected(folder: Path) -> None:
    manifest = folder / MANIFEST
    manifest.write_bytes(manifest.read_bytes().replace(b'"schema_version": 4', b'"schema_version":  4'))
    assert failed(folder, run_program=False) == ["manifest seal"]


def test_sign_then_verify_with_the_key_and_tampering(folder: Path, tmp_path: Path) -> None:
    private, public = key_pair(tmp_path, "ours")
    _, other_public = key_pair(tmp_path, "theirs")
    runner = CliRunner()
    result = runner.invoke(main, ["sign", str(folder), "--key", str(private)])
    assert result.exit_code == 0, result.output
    assert (folder / "model.sig").is_file()
    assert failed(folder, public_key=public, run_program=False) == []
    assert failed(folder, public_key=other_public, run_program=False) == ["signature"]
    unchecked = verify_artifact(folder, run_program=False)
    assert unchecked.ok and [c.ok for c in unchecked.checks if c.name == "signature"] == [None]
    tokenizer = folder / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes().replace(b'"', b"'", 1))
    assert set(failed(folder, public_key=public, run_program=False)) == {"files", "signature"}


def test_cli_exit_codes(folder: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(main, ["verify", str(folder)])
    assert ok.exit_code == EXIT_OK, ok.output
    assert "verified" in ok.output
    model = next(p for p in folder.iterdir() if p.name.startswith("model."))
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    bad = runner.invoke(main, ["verify", str(folder)])
    assert bad.exit_code == EXIT_MISMATCH and "FAIL files" in bad.output
    unusable = runner.invoke(main, ["verify", str(tmp_path / "nowhere")])
    assert unusable.exit_code == EXIT_UNUSABLE and "no manifest.json" in unusable.output
    with pytest.raises(ArtifactError, match="key file not found"):
        verify_artifact(folder, public_key=tmp_path / "absent.pem")


def test_signing_a_folder_that_does_not_verify_is_refused(folder: Path, tmp_path: Path) -> None:
    private, _ = key_pair(tmp_path, "ours")
    (folder / "extra.bin").write_bytes(b"\0")
    result = CliRunner().invoke(main, ["sign", str(folder), "--key", str(private)])
    assert result.exit_code == 2 and "does not verify" in result.output
    assert not (folder / "model.sig").exists()
