"""``exporter eval`` on a real artifact: figures in the artifact's runtime vs eager fp32."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from exporter.errors import ArtifactError
from exporter.measure.evaluate import eval_path, evaluate, read_evals


def test_eval_scores_and_files_beside_the_artifact(
    tiny_artifact: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    before = {p.name: p.read_bytes() for p in tiny_artifact.iterdir()}
    text = tmp_path / "t.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 20)
    result = evaluate(tiny_artifact, text, tiny_checkpoint, max_tokens=40)
    assert result["tokens_scored"] == 40
    # fp32 artifact: the same distribution as eager fp32
    assert result["perplexity_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert result["top1_agreement"] == 1.0 and result["mean_kl"] < 1e-5
    manifest = json.loads((tiny_artifact / "manifest.json").read_text())
    assert read_evals(tiny_artifact, manifest)["file:t.txt"] == result
    # the sealed folder is left as it was built
    assert {p.name: p.read_bytes() for p in tiny_artifact.iterdir()} == before


def test_a_text_longer_than_the_cache_is_scored_in_windows_with_an_interval(
    tiny_artifact: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    text = tmp_path / "long.txt"
    text.write_text("".join(f"def f{i}(a, b):\n    return a * {i} + b\n" for i in range(200)))
    result = evaluate(tiny_artifact, text, tiny_checkpoint, max_tokens=300)  # cache: 128 positions
    assert result["tokens_scored"] == 300 and result["windows"] == 3
    low, high = result["perplexity_ratio_interval"]
    assert low <= result["perplexity_ratio"] <= high and high - low < 1e-3  # fp32: no spread


def test_the_interval_covers_a_known_ratio_and_narrows_with_more_tokens() -> None:
    from exporter.gate.judge import ratio_interval

    g = torch.Generator().manual_seed(0)
    ref = torch.rand(4096, generator=g) * 4
    art = ref + 0.05 + torch.randn(4096, generator=g) * 0.5  # true ratio exp(0.05)
    interval, short = ratio_interval(art, ref), ratio_interval(art[:512], ref[:512])
    assert interval is not None and short is not None
    low, high = interval
    assert low < math.exp(0.05) < high
    assert short[1] - short[0] > high - low
    assert ratio_interval(art[:40], ref[:40]) is None  # a single block: no interval


def test_eval_results_of_another_build_are_ignored(tmp_path: Path) -> None:
    folder = tmp_path / "android-arm64"
    record = {"artifact_sha256": "a" * 64, "results": {"shipped:code": {"perplexity_ratio": 1.2}}}
    eval_path(folder).write_text(json.dumps(record))
    assert read_evals(folder, {"artifact": {"sha256": "a" * 64}}) == record["results"]
    assert read_evals(folder, {"artifact": {"sha256": "b" * 64}}) == {}


def test_eval_refuses_another_checkpoint(tiny_artifact: Path, make_checkpoint: Callable[..., Path]) -> None:
    other = make_checkpoint("other", seed=7)
    with pytest.raises(ArtifactError, match="is not the checkpoint"):
        evaluate(tiny_artifact, None, other)


def test_eval_names_a_missing_text_file(tiny_artifact: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot read text") as info:
        evaluate(tiny_artifact, tmp_path / "absent.txt", tiny_checkpoint)
    assert info.value.path == tmp_path / "absent.txt"
