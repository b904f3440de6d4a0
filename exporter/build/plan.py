"""The build matrix: every (checkpoint, recipe) job with its content-addressed key. No torch.

A job's key is a sha256 over everything its artifact is made from: the bytes of the checkpoint files
the build reads, the fully resolved recipe (``--set`` overrides included), the tool versions and the
exporter's own source and shipped texts. Equal keys mean the build would publish the same artifact,
so ``exporter.build.cache`` reuses a finished one instead. Deciding a key must cost milliseconds even for a
multi-gigabyte checkpoint: file digests are remembered by (path, size, mtime_ns, inode), so an
unchanged file is hashed once per machine, and nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifact.manifest import tool_versions, write_json_atomically
from ..errors import CheckpointError
from ..recipe import Recipe, list_recipes, load_recipe, recipe_path

PACKAGE = Path(__file__).resolve().parents[1]  # the exporter package
# The same folder as ``pipeline.DEFAULT_CHECKPOINT``, named here so planning needs no torch.
DEFAULT_CHECKPOINT = PACKAGE / "data" / "pycode-4m"
DEFAULT_OUT = Path("artifacts")
# Everything besides the weights that a build reads from a checkpoint folder, where present:
# the config, tokenizer and generation settings, the chat template and the gate's held-out text.
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "heldout.txt",
    "model.safetensors.index.json",
)
# Bump when the key's payload changes shape, so old keys can never match new ones.
KEY_SCHEMA = 1
CACHE_ENV = "EXPORTER_CACHE"


@dataclass(frozen=True)
class Job:
    """One build of the matrix: where its artifact goes and the key it is published under."""

    model: str  # the checkpoint folder's name, as the artifact folder and manifest name it
    checkpoint: Path
    recipe: str  # the recipe's name, or the path given for a recipe outside recipes/
    overrides: tuple[str, ...]
    key: str
    out: Path  # the artifact folder: <out>/<model>/<recipe name>

    def to_matrix_entry(self) -> dict[str, str]:
        """What a CI job needs to run this build, as plain strings (``fromJSON`` matrix include)."""
        return {
            "model": self.model,
            "checkpoint": _display(self.checkpoint),
            "recipe": self.recipe,
            "set": " ".join(f"--set {o}" for o in self.overrides),
            "key": self.key,
            "out": _display(self.out),
        }


def _display(path: Path) -> str:
    """Relative to the working directory where it lies under it (CI runs from the repository)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def digest_memo_path() -> Path:
    """``$EXPORTER_CACHE/digests.json`` when a cache folder is set, else the user's cache dir."""
    cache = os.environ.get(CACHE_ENV)
    if cache:
        return Path(cache) / "digests.json"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "exporter" / "digests.json"


class DigestMemo:
    """sha256 of files, remembered by (path, size, mtime_ns, inode): a rewritten file changes its
    mtime or inode, so only unchanged files are taken from the memo. A damaged memo is ignored."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or digest_memo_path()
        self.changed = False
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
            self.entries: dict[str, list[Any]] = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            self.entries = {}

    def sha256(self, file: Path) -> str:
        st = file.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        name = str(file.resolve())
        entry = self.entries.get(name)
        if isinstance(entry, list) and entry[:3] == stamp and len(entry) == 4:
            return str(entry[3])
        digest = _sha256_file(file)
        self.entries[name] = [*stamp, digest]
        self.changed = True
        return digest

    def save(self) -> None:
        """Best effort: a read-only home only costs the next run a re-hash."""
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomically(self.path, self.entries)
            self.changed = False
        except OSError:
            pass


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_files(folder: Path) -> list[Path]:
    """The files of ``folder`` a build reads: ``CHECKPOINT_FILES`` present and the safetensors
    weights (the shards the index names, else every ``*.safetensors``). A malformed index is keyed
    by its bytes; the build itself reports what is wrong with it."""
    if not (folder / "config.json").is_file():
        raise CheckpointError(folder, "not a checkpoint folder (config.json missing)")
    files = [folder / name for name in CHECKPOINT_FILES if (folder / name).is_file()]
    shards: set[str] = set()
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = {str(v) for v in json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()}
        except (ValueError, KeyError, TypeError, AttributeError):
            shards = set()
    else:
        shards = {p.name for p in folder.glob("*.safetensors")}
    return files + [folder / name for name in sorted(shards) if (folder / name).is_file()]


def source_files() -> list[Path]:
    """The exporter's own code and shipped texts: a build's output depends on them as much as on
    the tool versions, and a development checkout keeps one version number across many changes."""
    roots = (PACKAGE, PACKAGE.parent / "backends")
    code = [p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(code) + sorted((PACKAGE / "data" / "texts").glob("*.txt"))


def digest_named(files: Iterable[Path], root: Path, memo: DigestMemo) -> dict[str, str]:
    """{path relative to root: sha256}; names are part of what is keyed, absolute places are not."""
    return {f.relative_to(root).as_posix(): memo.sha256(f) for f in files}


def build_key(checkpoint: Path, recipe: Recipe, recipe_file: Path, memo: DigestMemo | None = None) -> str:
    """The content-addressed key of building ``recipe`` from ``checkpoint`` with this installation."""
    own = memo or DigestMemo()
    checkpoint = Path(checkpoint)
    payload = {
        "key_schema": KEY_SCHEMA,
        "model": checkpoint.name,
        "checkpoint": digest_named(checkpoint_files(checkpoint), checkpoint, own),
        "recipe": recipe.to_dict(),
        "recipe_file": recipe_file.name,
        "tools": tool_versions(),
        "exporter_source": digest_named(source_files(), PACKAGE.parent, own),
    }
    if memo is None:
        own.save()
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def plan_job(
    recipe_arg: str,
    checkpoint: Path | None = None,
    out: Path | None = None,
    overrides: tuple[str, ...] = (),
    memo: DigestMemo | None = None,
) -> Job:
    """The job ``exporter build RECIPE [--checkpoint] [--out] [--set ...]`` would run."""
    folder = Path(checkpoint or DEFAULT_CHECKPOINT)
    if not folder.is_dir():
        raise CheckpointError(folder, "checkpoint folder not found")
    recipe = load_recipe(recipe_arg, overrides)
    key = build_key(folder, recipe, recipe_path(recipe_arg), memo)
    target = (out or DEFAULT_OUT) / folder.name / recipe.name
    return Job(folder.name, folder, recipe_arg, overrides, key, target)


def plan_jobs(
    checkpoints: tuple[Path, ...] = (),
    recipes: tuple[str, ...] = (),
    out: Path | None = None,
    overrides: tuple[str, ...] = (),
) -> list[Job]:
    """Every checkpoint x every recipe (defaults: the shipped model, every recipe in recipes/)."""
    memo = DigestMemo()
    names = recipes or tuple(p.stem for p in list_recipes())
    jobs = [
        plan_job(name, folder, out, overrides, memo)
        for folder in (checkpoints or (DEFAULT_CHECKPOINT,))
        for name in names
    ]
    memo.save()
    return jobs


def matrix(jobs: list[Job]) -> dict[str, list[dict[str, str]]]:
    """A GitHub Actions matrix: ``strategy.matrix: ${{ fromJSON(...) }}`` runs one job per entry."""
    return {"include": [job.to_matrix_entry() for job in jobs]}


def table(jobs: list[Job]) -> str:
    """The plan for people: one line per job, the key shortened as git shortens commits."""
    rows = [("model", "recipe", "key", "artifact folder")]
    rows += [(j.model, j.recipe, j.key[:12], _display(j.out)) for j in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ("  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]]) for r in rows)
    return "\n".join(lines)


def makefile(jobs: list[Job]) -> str:
    """A makefile with one target per job (``make -f FILE -j2`` runs two builds at a time); each
    target is phony: ``exporter build`` itself decides, by build key, whether there is work."""
    names = [shlex.quote(_display(j.out)) for j in jobs]
    lines = ["# generated by `exporter plan --make`", "EXPORTER ?= exporter", f"all: {' '.join(names)}"]
    lines.append(f".PHONY: all {' '.join(names)}")
    for job, name in zip(jobs, names, strict=True):
        args = [
            job.recipe,
            "--checkpoint",
            _display(job.checkpoint),
            "--out",
            _display(job.out.parent.parent),
        ]
        args += [a for o in job.overrides for a in ("--set", o)]
        lines += [f"{name}:", "\t$(EXPORTER) build " + " ".join(shlex.quote(a) for a in args)]
    return "\n".join(lines) + "\n"
