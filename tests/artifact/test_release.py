"""``exporter release`` on real built artifacts: verified first, deterministic archives, an index, a
Hub-style folder and SHA256SUMS that ``sha256sum -c`` accepts."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter.artifact.release import SUMS
from exporter.cli import main


@pytest.fixture
def root(tiny_artifact: Path, tmp_path: Path) -> Path:
    """An artifacts root as builds leave it: <model>/<target>/."""
    folder = tmp_path / "artifacts" / tiny_artifact.parent.name / tiny_artifact.name
    shutil.copytree(tiny_artifact, folder)
    return tmp_path / "artifacts"


def release(root: Path, out: Path) -> CliRunner.invoke:  # type: ignore[valid-type]
    return CliRunner().invoke(main, ["release", str(root), "--out", str(out)])


def test_release_folder_index_and_checksums(root: Path, tmp_path: Path) -> None:
    result = release(root, tmp_path / "rel")
    assert result.exit_code == 0, result.output
    out = tmp_path / "rel"
    index = json.loads((out / "index.json").read_text())
    (entry,) = index["targets"]
    manifest = json.loads(next(root.glob("*/*/manifest.json")).read_bytes())
    assert entry["sha256"] == manifest["artifact"]["sha256"] and entry["format"] == "executorch-pte"
    assert entry["runtime_needs"]["executorch_version"] and entry["memory_estimate_bytes"]["kv_cache"] > 0
    ratio = manifest["validation"]["vs_fp32"]["perplexity_ratio"]
    assert entry["quality"]["perplexity_ratio_to_fp32"] == ratio
    assert entry["verified_on"] == ["x86_64"]
    archive = out / entry["archive"]["file"]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    assert sorted(Path(n).name for n in names) == sorted(p.name for p in next(root.glob("*/*")).iterdir())
    model = manifest["model"]["name"]
    hub = out / "hub" / model
    assert (hub / "README.md").read_text().count(entry["sha256"][:16]) == 1
    assert (hub / "xnnpack" / f"{entry['target']}.pte").read_bytes() == (
        next(root.glob("*/*")) / manifest["artifact"]["file"]
    ).read_bytes()
    check = subprocess.run(["sha256sum", "-c", SUMS], cwd=out, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == len([p for p in out.rglob("*") if p.is_file()]) - 1


def test_the_same_artifacts_give_the_same_release(root: Path, tmp_path: Path) -> None:
    assert release(root, tmp_path / "a").exit_code == 0
    assert release(root, tmp_path / "b").exit_code == 0
    assert (tmp_path / "a" / SUMS).read_bytes() == (tmp_path / "b" / SUMS).read_bytes()


def test_an_artifact_that_does_not_verify_stops_the_release(root: Path, tmp_path: Path) -> None:
    assert release(root, tmp_path / "rel").exit_code == 0
    tokenizer = next(root.glob("*/*/tokenizer.json"))
    tokenizer.write_bytes(tokenizer.read_bytes() + b" ")
    result = release(root, tmp_path / "rel")
    assert result.exit_code == 2 and "does not verify" in result.output
    # the earlier release is still whole
    check = subprocess.run(["sha256sum", "-c", SUMS], cwd=tmp_path / "rel", capture_output=True)
    assert check.returncode == 0


def test_the_arm64_report_adds_the_cpus_a_file_matched_on(root: Path, tmp_path: Path) -> None:
    manifest = json.loads(next(root.glob("*/*/manifest.json")).read_bytes())
    report = tmp_path / "report.json"
    cpus = {"neoverse-n1": {"passed": True}, "cortex-a72": {"passed": False}}
    other = {"sha256": "0" * 64, "cpus": {"neoverse-n1": {"passed": True}}}
    entries = [{"sha256": manifest["artifact"]["sha256"], "cpus": cpus}, other]
    report.write_text(json.dumps({"artifacts": entries}))
    args = ["release", str(root), "--out", str(tmp_path / "rel"), "--arm64-report", str(report)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads((tmp_path / "rel" / "index.json").read_text())["targets"]
    assert entry["verified_on"] == ["x86_64", "aarch64 (qemu-user, neoverse-n1 CPU model)"]
    report.write_text("{}")
    broken = CliRunner().invoke(main, args)
    assert broken.exit_code == 2 and "not an ARM64 check report" in broken.output
