"""The ARM64 execution check: every artifact's ``.pte`` traced on x86, then in ONE emulated Python per
CPU model (imports dominate the emulated time), compared, and reported as JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import exporter
from exporter.errors import ArtifactError

from .compare import RELATIVE_TOLERANCE, REPORT_FORMAT, Comparison, artifact_entry, compare_traces
from .cpuinfo import CPU_MODELS, write_cpu_files
from .sysroot import Arm64SetupError, Sysroot, set_up

DEFAULT_REPORT = Path("artifacts/arm64-check/report.json")
REPO_ROOT = Path(exporter.__file__).resolve().parents[1]


@dataclass(frozen=True)
class Program:
    folder: Path
    manifest: dict[str, Any]
    pte: Path
    prompts: list[list[int]]


def load_program(folder: Path) -> Program:
    """An XNNPACK artifact folder: its ``.pte`` and the prompts of its golden vectors."""
    from exporter.artifact.golden import GOLDEN
    from exporter.manifest import listed_file, read_manifest

    manifest = read_manifest(folder)
    pte = listed_file(folder, manifest, "artifact")
    if pte.suffix != ".pte":
        raise ArtifactError(pte, "not an ExecuTorch program (.pte); the ARM64 check runs device recipes only")
    golden = folder / GOLDEN
    try:
        prompts = [list(case["prompt"]) for case in json.loads(golden.read_text(encoding="utf-8"))["cases"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArtifactError(golden, f"cannot read the golden prompts ({e}); rebuild the artifact") from e
    return Program(folder, manifest, pte, prompts)


def guest_command(sysroot: Sysroot, cpu: str, job: Path) -> list[str]:
    """The emulated Python running the runner on ``job``."""
    runner = "exporter.devtools.arm64.runner"
    return [
        sysroot.qemu,
        "-L",
        str(sysroot.sysroot),
        "-cpu",
        cpu,
        str(sysroot.python),
        "-m",
        runner,
        str(job),
    ]


def guest_env(sysroot: Sysroot) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "LANG", "TMPDIR")}
    return {**keep, "PYTHONPATH": f"{sysroot.site}{os.pathsep}{REPO_ROOT}", "PYTHONNOUSERSITE": "1"}


def run_emulated(
    sysroot: Sysroot, cpu: str, programs: Sequence[Program], steps: int, work: Path
) -> tuple[list[dict[str, torch.Tensor]], float]:
    """Traces of every program from one emulated process on ``cpu``, and that process's wall time."""
    write_cpu_files(sysroot.sysroot, CPU_MODELS[cpu], n_cpus=min(os.cpu_count() or 1, 4))
    outs = [work / f"{cpu}-{i}.pt" for i in range(len(programs))]
    job = work / f"{cpu}.json"
    entries = [
        {"pte": str(p.pte.resolve()), "prompts": p.prompts, "out": str(o)}
        for p, o in zip(programs, outs, strict=True)
    ]
    job.write_text(json.dumps({"steps": steps, "programs": entries}))
    start = time.perf_counter()
    done = subprocess.run(
        guest_command(sysroot, cpu, job), env=guest_env(sysroot), capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise Arm64SetupError(None, f"the emulated run on {cpu} failed (exit {done.returncode}): {tail}")
    return [torch.load(o) for o in outs], seconds


def check(
    folders: Sequence[Path],
    cpus: Sequence[str],
    steps: int = 16,
    root: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The report (see compare.py for its entries); raises ExporterError for unusable inputs or tools."""
    from .runner import trace_program

    programs = [load_program(Path(f)) for f in folders]
    start = time.perf_counter()
    sysroot = set_up(root, log)
    setup_seconds = time.perf_counter() - start
    x86 = [trace_program(p.pte, p.prompts, steps) for p in programs]
    compared: list[dict[str, Comparison]] = [{} for _ in programs]
    cpu_seconds = {}
    with tempfile.TemporaryDirectory(prefix="arm64-check-") as work:
        for cpu in cpus:
            traces, cpu_seconds[cpu] = run_emulated(sysroot, cpu, programs, steps, Path(work))
            for i, arm in enumerate(traces):
                compared[i][cpu] = compare_traces(x86[i], arm)
            log(f"arm64 check: {cpu} ran {len(programs)} program(s) in {cpu_seconds[cpu]:.1f} s")
    entries = [
        artifact_entry(str(p.folder), p.manifest, float(x["seconds"]), c)
        for p, x, c in zip(programs, x86, compared, strict=True)
    ]
    return {
        "format": REPORT_FORMAT,
        "host": platform.machine(),
        "emulator": "qemu-user " + qemu_version(sysroot.qemu),
        "relative_tolerance": RELATIVE_TOLERANCE,
        "decode_steps": steps,
        "setup_seconds": setup_seconds,
        "cpu_seconds": cpu_seconds,
        "artifacts": entries,
        "passed": all(e["passed"] for e in entries),
    }


def qemu_version(qemu: str) -> str:
    out = subprocess.run([qemu, "--version"], capture_output=True, text=True).stdout
    return out.split("version", 1)[-1].split()[0] if "version" in out else "unknown"
