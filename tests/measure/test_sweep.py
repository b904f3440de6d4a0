"""``exporter sweep`` on synthetic artifact folders (manifest.json + a model file of a known size) and a
synthetic peer race: no build, no evaluation unless a text is missing, and then a stand-in scorer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from exporter.artifact.manifest import SCHEMA_VERSION
from exporter.cli import main
from exporter.errors import ArtifactError
from exporter.measure.evaluate import eval_path
from exporter.measure.sweep import Point, as_report, markdown, peer_point, sweep, write_sweep

DIGEST = "a" * 64
INT4 = "int4 g32 int8 dynamic activations, float32 scales"
INT8 = "int8 per-channel int8 dynamic activations, float32 scales"


def write_artifact(
    folder: Path,
    recipe: str = "android-arm64",
    digest: str = DIGEST,
    ratios: dict[str, float] | None = None,
    size: int = 2_500_000,
) -> Path:
    ratios = {"prose": 1.08, "code": 1.04} if ratios is None else ratios
    folder.mkdir(parents=True)
    (folder / "model.pte").write_bytes(b"\0" * size)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "artifact": {"file": "model.pte", "size_bytes": size, "sha256": DIGEST},
        "model": {"name": "pycode-4m", "checkpoint_sha256": digest},
        "recipe": {"name": recipe},
        "quantization": {
            "precision": {
                "summary": {
                    INT8: {"tensors": 4, "parameters": 1_000_000},
                    INT4: {"tensors": 24, "parameters": 3_000_000},
                }
            }
        },
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    results = {f"shipped:{t}": {"text": f"shipped:{t}", "perplexity_ratio": r} for t, r in ratios.items()}
    eval_path(folder).write_text(json.dumps({"artifact_sha256": DIGEST, "results": results}))
    return folder


def no_scoring(folder: Path, text: str) -> float:
    raise AssertionError(f"{folder} was scored on {text} although its manifest has it")


def test_points_come_from_the_manifests(tmp_path: Path) -> None:
    a = write_artifact(tmp_path / "android-arm64")
    b = write_artifact(
        tmp_path / "linux-arm64", "linux-arm64", ratios={"prose": 1.3, "code": 1.2}, size=4_000_000
    )
    report = sweep([a, b], score=no_scoring)
    assert report["checkpoint"] == {"name": "pycode-4m", "sha256": DIGEST}
    first, second = report["points"]
    assert first == {
        "source": "ours",
        "recipe": "android-arm64",
        "label": "int4 g32 8da 75% + int8 per-channel 8da 25%",
        "pte_mb": 2.5,
        "perplexity_ratio": {"prose": 1.08, "code": 1.04},
        "path": str(a),
    }
    assert (second["recipe"], second["pte_mb"], second["perplexity_ratio"]["prose"]) == (
        "linux-arm64",
        4.0,
        1.3,
    )


def test_a_text_not_yet_evaluated_is_scored(tmp_path: Path) -> None:
    folder = write_artifact(tmp_path / "art", ratios={"prose": 1.08})
    calls: list[tuple[Path, str]] = []

    def score(f: Path, text: str) -> float:
        calls.append((f, text))
        return 1.5

    (point,) = sweep([folder], score=score)["points"]
    assert calls == [(folder, "code")]
    assert point["perplexity_ratio"] == {"prose": 1.08, "code": 1.5}


def test_artifacts_of_different_checkpoints_are_refused(tmp_path: Path) -> None:
    a = write_artifact(tmp_path / "a")
    b = write_artifact(tmp_path / "b", digest="b" * 64, ratios={})  # refused before it is scored
    with pytest.raises(ArtifactError, match="one checkpoint") as e:
        sweep([a, b], score=no_scoring)
    assert e.value.path == b and "bbbbbbbbbbbb" in e.value.message and "aaaaaaaaaaaa" in e.value.message

    result = CliRunner().invoke(main, ["sweep", str(a), str(b), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "one checkpoint" in lines[0]
    assert not (tmp_path / "out").exists()


def _race(digest: str, perplexity: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"pte_mb": 45.6, "decode_tokens_per_s": 80.0}
    if perplexity:
        row |= {"perplexity_ratio_prose": 1.2, "perplexity_ratio_code": 1.1}
    return {"checkpoint_sha256": digest, "recipe": "android-arm64", "peer_label": "export_llm x", "peer": row}


def test_peer_point_is_the_race_of_the_same_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "peer.json"
    path.write_text(json.dumps([_race("b" * 64, True), _race(DIGEST, True)]))
    point = peer_point(path, DIGEST)
    assert point == Point(
        "peer", "android-arm64", "export_llm x", 45.6, {"prose": 1.2, "code": 1.1}, str(path)
    )
    with pytest.raises(ArtifactError, match="no race"):
        peer_point(path, "c" * 64)
    path.write_text(json.dumps([_race(DIGEST, False)]))  # random weights: no perplexity
    with pytest.raises(ArtifactError, match="no prose perplexity"):
        peer_point(path, DIGEST)


def test_cli_writes_json_and_png(tmp_path: Path) -> None:
    a = write_artifact(tmp_path / "android-arm64")
    peer = tmp_path / "peer.json"
    peer.write_text(json.dumps([_race(DIGEST, True)]))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["sweep", str(a), "--peer", str(peer), "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "sweep.json").read_text())
    assert [p["source"] for p in report["points"]] == ["ours", "peer"]
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| peer | android-arm64 | export_llm x | 45.60 | 1.2000 | 1.1000 |" in result.stdout


def test_report_files_from_synthetic_points(tmp_path: Path) -> None:
    points = [
        Point("ours", "reference-fp32", "float32 100%", 17.0, {"prose": 1.0, "code": 1.0}, "a"),
        Point("ours", "android-arm64", "int4 g32 8da 100%", 4.1, {"prose": 1.08, "code": 1.04}, "b"),
        Point("peer", "android-arm64", "export_llm", 5.2, {"prose": 1.3, "code": 1.2}, "peer.json"),
    ]
    report = as_report(points, "pycode-4m", DIGEST)
    json_path, png_path = write_sweep(report, tmp_path / "sweep")
    assert json.loads(json_path.read_text()) == report
    assert report["points"][2]["perplexity_ratio"] == {"prose": 1.3, "code": 1.2}
    png = png_path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000  # a drawn chart, not an empty file
    assert markdown(report).count("\n") == 2 + len(points)
