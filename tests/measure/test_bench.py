"""``exporter bench``: figures come from real runs of the subjects; the report files are written."""

from __future__ import annotations

import json
from pathlib import Path

from exporter.measure.bench import bench, markdown, measure_read_bandwidth, write_report


def test_read_bandwidth_is_plausible() -> None:
    bw = measure_read_bandwidth(megabytes=64, repeats=2)
    assert 1e8 < bw < 1e12  # between 0.1 GB/s and 1 TB/s


def test_bench_artifact_and_eager(tiny_artifact: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    report = bench([tiny_artifact], prompt_tokens=16, decode_tokens=8, repeats=2, checkpoint=tiny_checkpoint)
    names = [r["name"] for r in report["rows"]]
    assert names == ["reference-fp32 (model.pte)", "eager fp32"]  # fp32 artifact: no quantized eager
    for row in report["rows"]:
        d = row["decode_tokens_per_s"]
        assert 0 < d["min"] <= d["median"] <= d["max"]
        assert row["peak_rss_mb"] > 50 and row["weight_bytes"] > 0
        assert row["decode_roofline_tokens_per_s"] > 0
    paths = write_report(report, tmp_path / "bench")
    assert json.loads(paths[0].read_text())["rows"][0]["name"] == names[0]
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| reference-fp32 (model.pte) |" in markdown(report)
