"""Compare the emulated aarch64 traces of a program with its x86 traces, and assemble the report."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

REPORT_FORMAT = "exporter-arm64-check/1"
# Allowed max |logit difference|, relative to the largest |logit| of the x86 run: two CPUs may sum
# in another order (fp32 rounding, ~1e-7 relative per operation), far below what changes a token.
RELATIVE_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Comparison:
    tokens_equal: bool
    max_abs_logit_diff: float
    logit_scale: float  # max |logit| of the x86 run
    tolerance: float  # RELATIVE_TOLERANCE * logit_scale
    seconds: float  # the emulated loads and calls, Python imports excluded
    error: str | None = None  # why the emulated run gave no trace

    @property
    def passed(self) -> bool:
        return self.error is None and self.tokens_equal and self.max_abs_logit_diff <= self.tolerance

    def to_json(self) -> dict[str, Any]:
        """NaN (nothing measured) becomes null: the report is strict JSON."""
        fields = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}
        return {**fields, "passed": self.passed}


def not_run(error: str | None) -> Comparison:
    """The entry of a program the emulated process never traced."""
    nan = float("nan")
    return Comparison(False, nan, nan, nan, nan, error or "the emulated process wrote no trace")


def prompt_count(traces: dict[str, torch.Tensor]) -> int:
    return sum(1 for key in traces if key.startswith("tokens"))


def compare_traces(
    x86: dict[str, torch.Tensor], arm: dict[str, torch.Tensor], relative_tolerance: float = RELATIVE_TOLERANCE
) -> Comparison:
    """Greedy tokens must be identical; logits close. A missing or misshapen trace fails (NaN diff)."""
    n = prompt_count(x86)
    tokens_equal = prompt_count(arm) == n and all(
        torch.equal(x86[f"tokens{i}"], arm[f"tokens{i}"]) for i in range(n)
    )
    scale = max(float(x86[f"logits{i}"].abs().max()) for i in range(n))
    diff = 0.0
    for i in range(n):
        a, b = x86[f"logits{i}"], arm.get(f"logits{i}")
        if b is None or a.shape != b.shape:
            diff = float("nan")
            break
        diff = max(diff, float((a - b).abs().max()))
    return Comparison(
        tokens_equal, diff, scale, relative_tolerance * scale, float(arm.get("seconds", float("nan")))
    )


def artifact_entry(
    folder: str, manifest: dict[str, Any], x86_seconds: float, by_cpu: dict[str, Comparison]
) -> dict[str, Any]:
    """One report entry; ``sha256`` is the manifest's ``artifact.sha256``, so a release can match it to
    the exact file that was checked."""
    return {
        "folder": folder,
        "model": manifest.get("model", {}).get("name"),
        "recipe": manifest.get("recipe", {}).get("name"),
        "file": manifest["artifact"]["file"],
        "sha256": manifest["artifact"]["sha256"],
        "x86_seconds": x86_seconds,
        "cpus": {cpu: c.to_json() for cpu, c in by_cpu.items()},
        "passed": all(c.passed for c in by_cpu.values()),
    }


def failures(report: dict[str, Any]) -> list[str]:
    """One line per failed comparison."""
    lines = []
    for entry in report["artifacts"]:
        for cpu, c in entry["cpus"].items():
            if c["error"]:
                lines.append(f"{entry['folder']} on {cpu}: {c['error']}")
            elif not c["passed"]:
                what = "greedy tokens differ" if not c["tokens_equal"] else "logits differ"
                lines.append(
                    f"{entry['folder']} on {cpu}: {what} (max |diff| {c['max_abs_logit_diff']:.3g}, "
                    f"tolerance {c['tolerance']:.3g})"
                )
    return lines
