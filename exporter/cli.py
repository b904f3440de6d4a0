"""``exporter`` command line: thin; each command parses, calls one library function, prints.

Errors the user can fix (``ExporterError``) are one line on stderr and exit code 2; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import click

from .errors import ExporterError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ExporterError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option("--quiet", is_flag=True, help="Hide stage progress.")
@click.pass_context
def main(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """Turn a Hugging Face Llama-family checkpoint into ExecuTorch / AOTInductor artifacts."""
    ctx.obj = {"debug": debug}
    # Our progress goes to stderr; the libraries' own INFO chatter stays below the root's WARNING.
    log = logging.getLogger("exporter")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False
    if not debug:
        _hush_libraries()


def _hush_unless_debug() -> None:
    ctx = click.get_current_context()
    if not (ctx.obj and ctx.obj.get("debug")):
        _hush_libraries()


def _hush_libraries() -> None:
    """Deprecation chatter of torch/torchao/ExecuTorch internals and torchao's notes about CUDA-only
    extensions it cannot load on CPU say nothing a user can act on. Importing torch sets its
    loggers' levels again, so commands that import it call this once more afterwards."""
    warnings.simplefilter("ignore")
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torch gives it its own level


@main.command()
@click.argument("recipe")
@click.option(
    "--checkpoint", type=click.Path(path_type=Path), help="Hugging Face folder (default: shipped model)."
)
@click.option("--out", type=click.Path(path_type=Path), help="Artifacts root (default: artifacts/).")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a recipe key, e.g. quantization.linear.group_size=64.",
)
@click.option("--force", is_flag=True, help="Build even if a finished artifact has the same build key.")
def build(
    recipe: str, checkpoint: Path | None, out: Path | None, overrides: tuple[str, ...], force: bool
) -> None:
    """Build, validate and publish the artifact of RECIPE (a name in recipes/ or a .toml path).

    A finished artifact with the same build key (exporter plan) in the output folder or in
    $EXPORTER_CACHE is reused instead, without importing torch."""
    from .build.cache import reuse

    found = None if force else reuse(recipe, checkpoint, out, overrides)
    if found is not None:
        click.echo(f"up to date: {found.folder} (key {found.key[:12]})", err=True)
        click.echo(str(found.folder))
        return
    from .build.pipeline import build as run_build

    _hush_unless_debug()
    click.echo(str(run_build(recipe, checkpoint, out, overrides, force=True)))


@main.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--prompt", help="Raw text to continue.")
@click.option("--chat", "message", help="A user message, rendered with the checkpoint's chat template.")
@click.option("--system", help="System message for --chat (default: the template's own, if any).")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1))
def run(
    artifact_dir: Path, prompt: str | None, message: str | None, system: str | None, max_new_tokens: int
) -> None:
    """Generate greedily from an artifact in its own runtime and report tokens/s.

    --prompt continues raw text; --chat answers a message as transformers' apply_chat_template
    would prompt the model, and stops at the checkpoint's end-of-turn token."""
    import torch  # noqa: F401 - imported before the runtimes so its log levels can be set

    from .gate.generate import generate

    _hush_unless_debug()
    if (prompt is None) == (message is None):
        raise click.UsageError("give exactly one of --prompt and --chat")
    if system is not None and message is None:
        raise click.UsageError("--system goes with --chat")
    text = message if message is not None else prompt
    assert text is not None
    result = generate(artifact_dir, text, max_new_tokens, chat=message is not None, system=system)
    click.echo(result.text)
    click.echo(
        f"prefill {result.prefill_tokens} tokens at {result.prefill_tokens_per_s:.1f} tok/s, "
        f"decode {result.decode_tokens} tokens at {result.decode_tokens_per_s:.1f} tok/s"
        + (", stopped at EOS" if result.stopped_at_eos else ""),
        err=True,
    )


@main.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect(artifact_dir: Path, as_json: bool) -> None:
    """Size, bits per parameter, delegation and validation figures of an artifact."""
    from .artifact.summary import summarize

    summary = summarize(artifact_dir)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            click.echo(f"{key:28} {value}")


@main.command(name="eval")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option(
    "--text",
    "text_file",
    type=click.Path(path_type=Path),
    help="A shipped text (other-prose, other-code, prose, code, prose-and-code) or a file "
    "(default: the text the gate scored).",
)
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    help="Checkpoint the artifact was built from (default: shipped model).",
)
@click.option("--max-tokens", default=2048, show_default=True, type=click.IntRange(1))
def evaluate(artifact_dir: Path, text_file: Path | None, checkpoint: Path | None, max_tokens: int) -> None:
    """Teacher-forced perplexity, top-1 agreement and KL of an artifact vs eager fp32 (JSON)."""
    from .measure.evaluate import evaluate as run_eval

    click.echo(json.dumps(run_eval(artifact_dir, text_file, checkpoint, max_tokens), indent=2))


@main.command(name="bench")
@click.argument("artifact_dirs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--prompt-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--decode-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1))
@click.option("--eager/--no-eager", default=True, show_default=True, help="Also time eager PyTorch.")
@click.option(
    "--export",
    "export_recipes",
    multiple=True,
    metavar="RECIPE",
    help="Also build RECIPE and report per-stage export cost.",
)
@click.option("--checkpoint", type=click.Path(path_type=Path), help="Checkpoint for eager rows and --export.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("artifacts/bench"), show_default=True)
def bench_cmd(
    artifact_dirs: tuple[Path, ...],
    prompt_tokens: int,
    decode_tokens: int,
    repeats: int,
    eager: bool,
    export_recipes: tuple[str, ...],
    checkpoint: Path | None,
    out: Path,
) -> None:
    """Time artifacts against eager PyTorch; write bench.json, bench.md and bench.png."""
    from .measure.bench import bench, export_cost, markdown, write_report

    report = bench(list(artifact_dirs), prompt_tokens, decode_tokens, repeats, eager, checkpoint)
    report["export"] = [export_cost(r, checkpoint) for r in export_recipes]
    paths = write_report(report, out)
    click.echo(markdown(report))
    click.echo("wrote " + ", ".join(map(str, paths)), err=True)


@main.command(name="sweep")
@click.argument("artifact_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--peer",
    "peer_json",
    type=click.Path(path_type=Path),
    help="peer.json of `make bench-peer`: adds ExecuTorch export_llm's program of the same checkpoint.",
)
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    help="Checkpoint the artifacts were built from, to score texts they lack (default: shipped model).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), required=True, help="Folder for sweep.json and sweep.png."
)
def sweep_cmd(
    artifact_dirs: tuple[Path, ...], peer_json: Path | None, checkpoint: Path | None, out: Path
) -> None:
    """Perplexity ratio to fp32 (prose, code) against model file size, one point per artifact of one
    checkpoint; texts an artifact was not evaluated on are scored as `exporter eval --text` does."""
    from .measure.sweep import markdown, sweep, write_sweep

    _hush_unless_debug()
    report = sweep(list(artifact_dirs), peer_json, checkpoint)
    paths = write_sweep(report, out)
    click.echo(markdown(report))
    click.echo("wrote " + ", ".join(map(str, paths)), err=True)


@main.command()
@click.option(
    "--models",
    "checkpoints",
    multiple=True,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Checkpoint folder; repeat for more (default: the shipped model).",
)
@click.option(
    "--recipes", "recipe_args", multiple=True, metavar="NAME", help="Repeat for more (default: all)."
)
@click.option("--out", type=click.Path(path_type=Path), help="Artifacts root (default: artifacts/).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override for every job.")
@click.option("--json", "as_json", is_flag=True, help='A GitHub Actions matrix: {"include": [...]}.')
@click.option("--make", "as_make", is_flag=True, help="A makefile with one target per job (make -j).")
def plan(
    checkpoints: tuple[Path, ...],
    recipe_args: tuple[str, ...],
    out: Path | None,
    overrides: tuple[str, ...],
    as_json: bool,
    as_make: bool,
) -> None:
    """List the build jobs (checkpoint x recipe) with their content-addressed build keys."""
    from .build.plan import makefile, matrix, plan_jobs, table

    jobs = plan_jobs(checkpoints, recipe_args, out, overrides)
    click.echo(
        json.dumps(matrix(jobs)) if as_json else makefile(jobs) if as_make else table(jobs), nl=not as_make
    )


@main.command()
def recipes() -> None:
    """List the shipped recipes."""
    from .recipe import list_recipes, load_recipe

    for path in list_recipes():
        r = load_recipe(str(path))
        click.echo(f"{r.name:18} {r.backend:8} {r.description}")
        click.echo(f"{'':27} {r.tradeoff()}")


@main.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--key", type=click.Path(path_type=Path), help="Public key (PEM): also check model.sig.")
@click.option("--no-run", is_flag=True, help="Check files, records and signature only; load nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(artifact_dir: Path, key: Path | None, no_run: bool, as_json: bool) -> None:
    """Check an artifact folder: seals, schema, every file's sha256, signature, that this runtime can
    run the program, and its golden vectors. Exit 0 all passed, 1 a check failed, 2 unusable input."""
    from .artifact.verify import EXIT_MISMATCH, EXIT_OK, verify_artifact

    _hush_unless_debug()
    report = verify_artifact(artifact_dir, key, run_program=not no_run)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for c in report.checks:
            mark = {True: "ok  ", False: "FAIL", None: "skip"}[c.ok]
            click.echo(f"{mark} {c.name}: {c.detail}")
        click.echo(f"{artifact_dir}: {'verified' if report.ok else 'NOT verified'}")
    sys.exit(EXIT_OK if report.ok else EXIT_MISMATCH)


@main.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--key", required=True, type=click.Path(path_type=Path), help="Private EC key (PEM).")
def sign(artifact_dir: Path, key: Path) -> None:
    """Sign an artifact folder offline (OpenSSF model-signing, elliptic-curve key): writes model.sig,
    which `exporter verify ARTIFACT_DIR --key PUBLIC.pem` checks. The folder must verify first."""
    from .artifact.sign import sign_artifact
    from .artifact.verify import verify_artifact

    report = verify_artifact(artifact_dir, run_program=False)
    if not report.ok:
        failed = "; ".join(f"{c.name}: {c.detail}" for c in report.checks if c.ok is False)
        raise ExporterError(artifact_dir, f"not signed: the folder does not verify ({failed})")
    click.echo(str(sign_artifact(artifact_dir, key)))


@main.command(name="release")
@click.argument("artifacts_dir", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Release folder (replaced).")
@click.option("--key", type=click.Path(path_type=Path), help="Public key that signed every artifact.")
@click.option(
    "--arm64-report",
    type=click.Path(path_type=Path),
    help="Report of `python -m tools.arm64`: adds the emulated CPUs to verified_on.",
)
def release_cmd(artifacts_dir: Path, out: Path, key: Path | None, arm64_report: Path | None) -> None:
    """Verify every artifact under ARTIFACTS_DIR (<model>/<target>/) and write the release: one
    deterministic archive per target, index.json, a Hub-style folder with a model card, SHA256SUMS."""
    from .artifact.release import arm64_platforms, release
    from .artifact.verify import verify_artifact

    _hush_unless_debug()
    arm64 = arm64_platforms(arm64_report) if arm64_report else None
    folder = release(artifacts_dir, out, lambda f: verify_artifact(f, key), arm64)
    for path in sorted(folder.iterdir()):
        click.echo(str(path))


if __name__ == "__main__":
    main()
