"""``exporter release``: the app-team release of a folder of artifacts.

Every artifact folder under the root (``<model>/<target>/``) is verified first (seals, files,
runtime, golden vectors); one that fails stops the release. The release folder then holds:

- ``<model>-<target>.tar.gz`` per target: the artifact folder as it is (model file, tokenizer,
  manifest, golden vectors, build record, signature if signed), deterministic (sorted entries, fixed
  times, owners and modes; gzip without a timestamp), so the same artifacts give the same archives;
- ``index.json``: every target with its device, format, what a runtime needs, size, memory estimate
  including the KV cache, quality figures and digests;
- ``hub/<model>/``: a Hugging Face Hub-style folder to upload as is (README model card with the
  figures, ``xnnpack/<target>.pte`` / ``aoti/<target>.pt2``, tokenizer, manifests);
- ``SHA256SUMS`` over every other file, checkable with ``sha256sum -c SHA256SUMS``.

It is written into a staging folder and renamed into place, so a reader never sees half a release.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ArtifactError
from .card import model_card
from .folder import MANIFEST, sha256_file
from .verify_types import Report

INDEX_FORMAT = "exporter-release-index/1"
SUMS = "SHA256SUMS"
FORMAT_DIRS = {"executorch-pte": "xnnpack", "aoti-pt2": "aoti"}
Verifier = Callable[[Path], Report]


def find_artifacts(root: Path) -> list[Path]:
    """Artifact folders (``<model>/<target>/`` holding a manifest) under ``root``, sorted."""
    found = sorted(p.parent for p in Path(root).glob(f"*/*/{MANIFEST}") if not p.parent.name.startswith("."))
    if not found:
        raise ArtifactError(root, "no artifact folders (<model>/<target>/manifest.json) to release")
    return found


def deterministic_tar_gz(folder: Path, arcname: str, out: Path) -> Path:
    """A .tar.gz of ``folder`` whose bytes depend only on the files' names and contents."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            info = tarfile.TarInfo(f"{arcname}/{path.name}")
            info.size, info.mtime, info.mode = path.stat().st_size, 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(buffer.getvalue())
    return out


def runtime_needs(runtime: dict[str, Any]) -> dict[str, Any]:
    if runtime["format"] == "executorch-pte":
        keys = ("executorch_version", "delegates", "kernel_libraries", "operators_outside_delegate")
    else:
        keys = ("torch_version", "cpu_isa", "compiler", "entry_points")
    return {k: runtime[k] for k in keys if k in runtime}


def quality(validation: dict[str, Any]) -> dict[str, Any]:
    vs_fp32, vs_eager = validation.get("vs_fp32", {}), validation.get("vs_eager", {})
    return {
        "perplexity_ratio_to_fp32": vs_fp32.get("perplexity_ratio"),
        "top1_agreement_clear": vs_fp32.get("artifact", {}).get("top1_agreement_clear"),
        "kl_vs_eager": vs_eager.get("heldout_mean_kl"),
        "greedy_tokens_identical_min": vs_eager.get("greedy_tokens_identical_min"),
        "greedy_steps": vs_eager.get("steps"),
        "text": validation.get("text", {}).get("source"),
    }


def index_entry(
    folder: Path, manifest: dict[str, Any], archive: Path, verified_on: list[str]
) -> dict[str, Any]:
    runtime, artifact = manifest["runtime"], manifest["artifact"]
    return {
        "model": manifest["model"]["name"],
        "target": manifest["recipe"]["name"],
        "device": manifest["recipe"]["resolved"].get("description", ""),
        "format": artifact["format"],
        "file": artifact["file"],
        "size_bytes": artifact["size_bytes"],
        "sha256": artifact["sha256"],
        "archive": {
            "file": archive.name,
            "sha256": sha256_file(archive),
            "size_bytes": archive.stat().st_size,
        },
        "runtime_needs": runtime_needs(runtime),
        "max_seq_len": runtime["max_seq_len"],
        "memory_estimate_bytes": runtime["memory_estimate_bytes"],
        "quality": quality(manifest["validation"]),
        "checkpoint_sha256": manifest["model"]["checkpoint_sha256"],
        "recipe_digest": manifest["recipe"]["digest"],
        "tools": manifest["tools"],
        "signed": (folder / "model.sig").is_file(),
        "verified_on": verified_on,
    }


def arm64_platforms(report_path: Path) -> dict[str, list[str]]:
    """From ``python -m tools.arm64``'s report: the emulated CPUs each file (by sha256)
    matched its x86 run on, within the tolerance its golden vectors state."""
    try:
        report = json.loads(Path(report_path).read_text(encoding="utf-8"))
        found: dict[str, list[str]] = {}
        for entry in report["artifacts"]:
            cpus = sorted(cpu for cpu, c in entry["cpus"].items() if c["passed"])
            if cpus:
                found[entry["sha256"]] = [f"aarch64 (qemu-user, {' and '.join(cpus)} CPU model)"]
        return found
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ArtifactError(report_path, f"not an ARM64 check report ({e})") from e


def verified_platforms(manifest: dict[str, Any], arm64: dict[str, list[str]]) -> list[str]:
    """Where this exact file ran and matched: here (the release verifies it) and, from the ARM64
    check's report, the emulated CPUs it matched on."""
    return ["x86_64", *arm64.get(manifest["artifact"]["sha256"], [])]


def write_hub(
    folders: list[Path], manifests: list[dict[str, Any]], entries: list[dict[str, Any]], hub: Path
) -> None:
    for folder, manifest in zip(folders, manifests, strict=True):
        model_dir = hub / manifest["model"]["name"]
        sub = model_dir / FORMAT_DIRS[manifest["artifact"]["format"]]
        sub.mkdir(parents=True, exist_ok=True)
        target, suffix = manifest["recipe"]["name"], Path(manifest["artifact"]["file"]).suffix
        shutil.copyfile(folder / manifest["artifact"]["file"], sub / f"{target}{suffix}")
        shutil.copyfile(folder / MANIFEST, sub / f"{target}.manifest.json")
        shutil.copyfile(folder / manifest["tokenizer"]["file"], model_dir / "tokenizer.json")
    for model in sorted({m["model"]["name"] for m in manifests}):
        rows = [e for e in entries if e["model"] == model]
        (hub / model / "README.md").write_text(model_card(model, rows))


def write_sums(out: Path) -> Path:
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != SUMS)
    lines = [f"{sha256_file(p)}  {p.relative_to(out).as_posix()}\n" for p in files]
    (out / SUMS).write_text("".join(lines))
    return out / SUMS


def release(root: Path, out: Path, verify: Verifier, arm64: dict[str, list[str]] | None = None) -> Path:
    """Verify every artifact under ``root`` and write the release into ``out`` (replaced whole)."""
    folders = find_artifacts(root)
    for folder in folders:
        report = verify(folder)
        if not report.ok:
            failed = "; ".join(f"{c.name}: {c.detail}" for c in report.checks if c.ok is False)
            raise ArtifactError(folder, f"does not verify, nothing released ({failed})")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        manifests = [json.loads((f / MANIFEST).read_bytes()) for f in folders]
        entries = []
        for folder, manifest in zip(folders, manifests, strict=True):
            name = f"{manifest['model']['name']}-{manifest['recipe']['name']}"
            archive = deterministic_tar_gz(folder, name, staging / f"{name}.tar.gz")
            entries.append(index_entry(folder, manifest, archive, verified_platforms(manifest, arm64 or {})))
        index = {"format": INDEX_FORMAT, "targets": entries}
        (staging / "index.json").write_text(json.dumps(index, indent=2) + "\n")
        write_hub(folders, manifests, entries, staging / "hub")
        write_sums(staging)
        os.chmod(staging, 0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
