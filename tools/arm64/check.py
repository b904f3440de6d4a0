"""The ARM64 execution check: every artifact's ``.pte`` traced on x86, then in ONE emulated Python per
CPU model (imports dominate the emulated time), compared, and reported as JSON."""

from __future__ import annotations

import json
import os
import platform
import signal
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

from .compare import RELATIVE_TOLERANCE, REPORT_FORMAT, Comparison, artifact_entry, compare_traces, not_run
from .cpuinfo import CPU_MODELS, write_cpu_files
from .sysroot import Sysroot, set_up

DEFAULT_REPORT = Path("artifacts/arm64-check/report.json")
REPO_ROOT = Path(exporter.__file__).resolve().parents[1]


@dataclass(frozen=True)
class Program:
    folder: Path
    manifest: dict[str, Any]
    pte: Path
    prompts: list[list[int]]
    # the tolerance the artifact promises app teams (its golden vectors'), relative to max |logit|
    relative_tolerance: float = RELATIVE_TOLERANCE


def load_program(folder: Path) -> Program:
    """An XNNPACK artifact folder: its ``.pte`` and the prompts of its golden vectors."""
    from exporter.artifact.golden import GOLDEN
    from exporter.artifact.manifest import listed_file, read_manifest

    manifest = read_manifest(folder)
    pte = listed_file(folder, manifest, "artifact")
    if pte.suffix != ".pte":
        raise ArtifactError(pte, "not an ExecuTorch program (.pte); the ARM64 check runs device recipes only")
    golden = folder / GOLDEN
    try:
        vectors = json.loads(golden.read_text(encoding="utf-8"))
        prompts = [list(case["prompt"]) for case in vectors["cases"]]
        rtol = float(vectors.get("relative_tolerance", RELATIVE_TOLERANCE))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArtifactError(golden, f"cannot read the golden prompts ({e}); rebuild the artifact") from e
    return Program(folder, manifest, pte, prompts, rtol)


def guest_command(sysroot: Sysroot, cpu: str, job: Path) -> list[str]:
    """The emulated Python running the runner on ``job``."""
    runner = "tools.arm64.runner"
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
) -> tuple[list[dict[str, torch.Tensor] | None], float, str | None]:
    """Traces of every program from one emulated process on ``cpu`` (None for those it did not reach),
    that process's wall time, and why it died, if it did."""
    write_cpu_files(sysroot.sysroot, CPU_MODELS[cpu], n_cpus=min(os.cpu_count() or 1, 4))
    outs = [work / f"{cpu}-{i}.pt" for i in range(len(programs))]
    job = work / f"{cpu}.json"
    entries = [
        {"pte": str(p.pte.resolve()), "prompts": p.prompts, "out": str(o)}
        for p, o in zip(programs, outs, strict=True)
    ]
    job.write_text(json.dumps({"steps": steps, "programs": entries}))
    start = time.perf_counter()
    done = subprocess.run(guest_command(sysroot, cpu, job), env=guest_env(sysroot), capture_output=True)
    seconds = time.perf_counter() - start
    traces = [torch.load(o) if o.exists() else None for o in outs]
    return traces, seconds, None if done.returncode == 0 else guest_failure(done.returncode, done.stderr)


def guest_failure(returncode: int, stderr: bytes) -> str:
    """One line for a dead emulated process (qemu re-raises the guest's fatal signal)."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (the CPU model lacks an instruction the aarch64 wheels use)" if name == "SIGILL" else ""
        return f"the emulated process was killed by {name}{hint}"
    lines = stderr.decode(errors="replace").strip().splitlines() or ["(no output)"]
    return f"the emulated process exited with {returncode}: {lines[-1]}"


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
            traces, cpu_seconds[cpu], error = run_emulated(sysroot, cpu, programs, steps, Path(work))
            for i, arm in enumerate(traces):
                compared[i][cpu] = (
                    compare_traces(x86[i], arm, programs[i].relative_tolerance)
                    if arm is not None
                    else not_run(error)
                )
            log(f"arm64 check: {cpu}: {error or 'ran'} in {cpu_seconds[cpu]:.1f} s")
    entries = [
        artifact_entry(str(p.folder), p.manifest, float(x["seconds"]), c)
        for p, x, c in zip(programs, x86, compared, strict=True)
    ]
    return {
        "format": REPORT_FORMAT,
        "host": platform.machine(),
        "emulator": "qemu-user " + qemu_version(sysroot.qemu),
        "relative_tolerance": {str(p.folder): p.relative_tolerance for p in programs},
        "decode_steps": steps,
        "setup_seconds": setup_seconds,
        "cpu_seconds": cpu_seconds,
        "artifacts": entries,
        "passed": all(e["passed"] for e in entries),
    }


def qemu_version(qemu: str) -> str:
    out = subprocess.run([qemu, "--version"], capture_output=True, text=True).stdout
    return out.split("version", 1)[-1].split()[0] if "version" in out else "unknown"
