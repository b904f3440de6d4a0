"""``python -m tools.arm64 ARTIFACT_DIR... --cpu cortex-a72 --cpu neoverse-n1 --out REPORT.json``

Exit 0 when every comparison passed, 1 when one failed, 2 (one line, no traceback) when an input or a
tool is unusable."""

from __future__ import annotations

import json
from pathlib import Path

import click

from exporter.errors import ExporterError

from .cpuinfo import CPU_MODELS

DEFAULT_CPUS = ("cortex-a72", "neoverse-n1")


class Unusable(click.ClickException):
    """An input or a tool the check cannot use: one line, exit 2 (a failed comparison exits 1)."""

    exit_code = 2


@click.command()
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--cpu", "cpus", multiple=True, type=click.Choice(sorted(CPU_MODELS)), help="qemu CPU model (repeat)."
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="Report JSON (outside artifact folders)."
)
@click.option(
    "--steps", type=click.IntRange(min=1), default=16, show_default=True, help="Greedy decode steps."
)
@click.option(
    "--root", type=click.Path(path_type=Path), default=None, help="Sysroot cache [$EXPORTER_ARM64_ROOT]."
)
def main(
    artifacts: tuple[Path, ...], cpus: tuple[str, ...], out: Path | None, steps: int, root: Path | None
) -> None:
    """Run ARTIFACTS' .pte files on an emulated aarch64 CPU and compare with this machine's run."""
    from .check import DEFAULT_REPORT, check
    from .compare import failures

    out = out or DEFAULT_REPORT
    try:
        refuse_inside(out, artifacts)
        report = check(artifacts, cpus or DEFAULT_CPUS, steps, root, log=lambda m: click.echo(m, err=True))
    except ExporterError as e:
        raise Unusable(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for entry in report["artifacts"]:
        for cpu, c in entry["cpus"].items():
            if c["error"]:
                click.echo(f"{entry['folder']} {cpu}: NOT RUN: {c['error']}")
                continue
            click.echo(
                f"{entry['folder']} {cpu}: tokens {'equal' if c['tokens_equal'] else 'DIFFER'}, "
                f"max |logit diff| {c['max_abs_logit_diff']:.3g} (tolerance {c['tolerance']:.3g}), "
                f"{c['seconds']:.1f} s"
            )
    click.echo(f"report: {out}")
    lines = failures(report)
    if lines:
        raise click.ClickException("; ".join(lines))


def refuse_inside(out: Path, artifacts: tuple[Path, ...]) -> None:
    """Artifact folders are sealed by their manifest: the report must not land in one."""
    for folder in artifacts:
        if out.resolve().is_relative_to(folder.resolve()):
            raise ExporterError(
                out, f"inside the sealed artifact folder {folder}; write the report elsewhere"
            )


if __name__ == "__main__":
    main()
