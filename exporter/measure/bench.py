"""``exporter bench``: load time, prefill and decode tokens/s, peak RSS, size and bits per parameter
of artifacts and of eager PyTorch (fp32 and quantized) on the same machine in one run; median, min
and max of several repetitions; the decode memory-bandwidth roofline.

Every subject runs in a fresh subprocess (``python -m exporter.measure.bench_worker``) so that its peak RSS
and load time are its own. Output: JSON, a Markdown table and a PNG chart.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..artifact.manifest import read_build_info, read_manifest
from ..errors import ExporterError


def measure_read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s of one core streaming a buffer far larger than any cache (best of ``repeats``)."""
    a = np.ones(megabytes * (1 << 20) // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - start)
    return a.nbytes / best


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_worker(args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "exporter.measure.bench_worker", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExporterError(None, f"benchmark of {' '.join(args[:2])} failed: {tail}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def subjects(artifacts: list[Path], eager: bool) -> list[list[str]]:
    """Worker arguments: every artifact; then eager fp32 and eager with each quantized artifact's
    recipe, built from the recipes resolved in the manifests (same max_seq_len, same schemes)."""
    out = [["artifact", str(a)] for a in artifacts]
    if eager and artifacts:
        out.append(["eager-fp32", str(artifacts[0])])
        seen = set()
        for a in artifacts:
            m = read_manifest(a)
            if m["recipe"]["resolved"]["quantization"]["linear"] and m["recipe"]["digest"] not in seen:
                seen.add(m["recipe"]["digest"])
                out.append(["eager", str(a)])
    return out


def bench(
    artifacts: list[Path],
    prompt_tokens: int,
    decode_tokens: int,
    repeats: int,
    eager: bool = True,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    bandwidth = measure_read_bandwidth()
    rows = []
    for args in subjects(artifacts, eager):
        extra = ["--checkpoint", str(checkpoint)] if checkpoint and args[0] != "artifact" else []
        raw = run_worker(
            [
                *args,
                *extra,
                "--prompt-tokens",
                str(prompt_tokens),
                "--decode-tokens",
                str(decode_tokens),
                "--repeats",
                str(repeats),
            ]
        )
        decode = _stats(raw["decode_tokens_per_s"])
        roofline = bandwidth / raw["weight_bytes"]
        rows.append(
            {
                "name": raw["name"],
                "kind": args[0],
                "load_s": raw["load_s"],
                "prefill_tokens_per_s": _stats(raw["prefill_tokens_per_s"]),
                "decode_tokens_per_s": decode,
                "peak_rss_mb": raw["peak_rss_mb"],
                "file_mb": raw.get("file_bytes", 0) / 1e6,
                "bits_per_parameter": raw.get("bits_per_parameter"),
                "weight_bytes": raw["weight_bytes"],
                "decode_roofline_tokens_per_s": roofline,
                "roofline_fraction": decode["median"] / roofline,
            }
        )
    return {
        "machine": {"read_bandwidth_gb_s": bandwidth / 1e9, "threads": _threads()},
        "settings": {"prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens, "repeats": repeats},
        "rows": rows,
    }


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def export_cost(recipe: str, checkpoint: Path | None) -> dict[str, Any]:
    """Build ``recipe`` in a fresh process and report its per-stage wall time and peak RSS."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "exporter", "--quiet", "build", recipe, "--out", out]
        if checkpoint:
            cmd += ["--checkpoint", str(checkpoint)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise ExporterError(None, f"export of {recipe} failed: {proc.stderr.strip().splitlines()[-1:]}")
        info = read_build_info(Path(proc.stdout.strip().splitlines()[-1]))
    return {"recipe": recipe, "wall_s": wall, "stages": info["timings"]}


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"Prompt {s['prompt_tokens']} tokens, decode {s['decode_tokens']} tokens, median of "
        f"{s['repeats']} (min-max); read bandwidth {report['machine']['read_bandwidth_gb_s']:.1f} GB/s, "
        f"{report['machine']['threads']} threads.",
        "",
        "| subject | load s | prefill tok/s | decode tok/s | peak RSS MB | file MB | bits/param | "
        "weights MB | decode roofline tok/s | of roofline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        p, d = r["prefill_tokens_per_s"], r["decode_tokens_per_s"]
        bits = "" if r["bits_per_parameter"] is None else f"{r['bits_per_parameter']:.2f}"
        lines.append(
            f"| {r['name']} | {r['load_s']:.3f} | {p['median']:.0f} ({p['min']:.0f}-{p['max']:.0f}) | "
            f"{d['median']:.0f} ({d['min']:.0f}-{d['max']:.0f}) | {r['peak_rss_mb']:.0f} | "
            f"{r['file_mb']:.2f} | {bits} | {r['weight_bytes'] / 1e6:.2f} | "
            f"{r['decode_roofline_tokens_per_s']:.0f} | {r['roofline_fraction']:.2f} |"
        )
    for e in report.get("export", []):
        stages = ", ".join(
            f"{k} {v['seconds']:.1f} s / {v['peak_rss_mb']:.0f} MB" for k, v in e["stages"].items()
        )
        lines += ["", f"Export `{e['recipe']}`: {e['wall_s']:.1f} s wall; {stages}."]
    return "\n".join(lines) + "\n"


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(rows) + 2))
    for ax, key, title in (
        (axes[0], "prefill_tokens_per_s", "prefill tokens/s"),
        (axes[1], "decode_tokens_per_s", "decode tokens/s"),
    ):
        med = [r[key]["median"] for r in rows]
        err = [
            [m - r[key]["min"] for m, r in zip(med, rows, strict=True)],
            [r[key]["max"] - m for m, r in zip(med, rows, strict=True)],
        ]
        ax.barh(names, med, xerr=err, color="#4878a8")
        ax.set_title(title)
        ax.invert_yaxis()
    axes[1].scatter(
        [r["decode_roofline_tokens_per_s"] for r in rows],
        names,
        marker="|",
        s=300,
        color="#c44",
        label="bandwidth roofline",
    )
    axes[1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.json", out / "bench.md", out / "bench.png"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(markdown(report))
    if report["rows"]:
        chart(report, paths[2])
    return paths
