"""The build plan's keys and the cache that reuses finished artifacts by key (no torch for either)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter.build import cache, plan
from exporter.build.cache import finished_key, remember, reuse
from exporter.build.plan import DEFAULT_CHECKPOINT, DigestMemo, plan_job, plan_jobs
from exporter.cli import main
from exporter.recipe import list_recipes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads or writes the user's digest memo or artifact cache."""
    monkeypatch.delenv(plan.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A private copy of the shipped checkpoint that a test may change."""
    return Path(shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "pycode-4m"))


def fake_artifact(folder: Path, key: str) -> Path:
    """A finished artifact as a lookup sees it: manifest with the key, files at their listed sizes."""
    folder.mkdir(parents=True)
    (folder / "model.pte").write_bytes(b"x" * 10)
    (folder / "tokenizer.json").write_text("{}")
    files = {n: {"size_bytes": (folder / n).stat().st_size} for n in ("model.pte", "tokenizer.json")}
    manifest = {"artifact": {"file": "model.pte", "size_bytes": 10}, "files": files, "build_key": key}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def run_python(code: str, **env: str) -> str:
    full_env = {**os.environ, **env}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_plan_and_cache_import_no_torch() -> None:
    code = (
        "import sys, exporter.build.plan, exporter.build.cache, exporter.cli; print('torch' in sys.modules)"
    )
    assert run_python(code) == "False"


def test_pipeline_and_plan_agree_on_the_default_checkpoint() -> None:
    from exporter.build.pipeline import DEFAULT_CHECKPOINT as PIPELINE_DEFAULT

    assert DEFAULT_CHECKPOINT == PIPELINE_DEFAULT


def test_key_is_the_same_across_processes_and_hash_seeds(private_cache: Path) -> None:
    code = "from exporter.build.plan import plan_job; print(plan_job('android-arm64', overrides=(%r,)).key)"
    code %= "export.max_seq_len=256"
    keys = {run_python(code, PYTHONHASHSEED=seed, XDG_CACHE_HOME=str(private_cache)) for seed in ("1", "2")}
    assert keys == {plan_job("android-arm64", overrides=("export.max_seq_len=256",)).key}


def test_key_changes_with_a_recipe_value() -> None:
    base = plan_job("android-arm64").key
    assert plan_job("android-arm64", overrides=("export.max_seq_len=256",)).key != base
    assert plan_job("ios-arm64").key != base


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "config.json"])
def test_key_changes_with_one_checkpoint_byte(ckpt: Path, name: str) -> None:
    before = plan_job("android-arm64", ckpt).key
    file = ckpt / name
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 1
    file.write_bytes(bytes(data))
    assert plan_job("android-arm64", ckpt).key != before


def test_key_changes_with_a_tool_version(monkeypatch: pytest.MonkeyPatch) -> None:
    before = plan_job("android-arm64").key
    real = plan.tool_versions()
    monkeypatch.setattr(plan, "tool_versions", lambda: {**real, "executorch": real["executorch"] + ".post1"})
    assert plan_job("android-arm64").key != before


def test_an_unchanged_file_is_hashed_once(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[str] = []
    real = plan._sha256_file

    def counting(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(plan, "_sha256_file", counting)
    first = plan_job("android-arm64", ckpt).key
    assert "model.safetensors" in hashed
    hashed.clear()
    assert plan_job("android-arm64", ckpt).key == first and hashed == []  # memo on disk, new process-like
    weights = ckpt / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    assert plan_job("android-arm64", ckpt).key == first and hashed == ["model.safetensors"]


def test_a_damaged_memo_is_ignored(tmp_path: Path) -> None:
    memo_file = tmp_path / "digests.json"
    memo_file.write_text("{not json")
    assert plan_job("android-arm64", memo=DigestMemo(memo_file)).key == plan_job("android-arm64").key


def test_plan_json_is_a_matrix_of_every_recipe() -> None:
    result = CliRunner().invoke(main, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    include = json.loads(result.stdout)["include"]
    assert [e["recipe"] for e in include] == [p.stem for p in list_recipes()]
    assert {e["key"] for e in include} == {j.key for j in plan_jobs()}
    assert all(e["out"] == f"artifacts/pycode-4m/{e['recipe']}" for e in include)


def test_plan_table_and_selection(ckpt: Path) -> None:
    args = ["plan", "--models", str(ckpt), "--models", str(DEFAULT_CHECKPOINT), "--recipes", "ios-arm64"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["model", "recipe", "key"]
    assert plan_job("ios-arm64", ckpt).key[:12] in lines[1]


def test_plan_refuses_a_folder_that_is_no_checkpoint(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["plan", "--models", str(tmp_path)])
    assert result.exit_code == 2 and "config.json missing" in result.stderr


def test_a_finished_artifact_is_reused_without_importing_torch(tmp_path: Path, private_cache: Path) -> None:
    job = plan_job("android-arm64", out=tmp_path)
    fake_artifact(job.out, job.key)
    code = (
        "import sys; from exporter.cli import main; "
        f"main(['build', 'android-arm64', '--out', {str(tmp_path)!r}], standalone_mode=False); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(private_cache)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines() == [str(job.out), "False"]
    assert done.stderr.strip() == f"up to date: {job.out} (key {job.key[:12]})"


def test_a_different_key_or_a_short_file_is_not_reused(tmp_path: Path) -> None:
    job = plan_job("android-arm64", out=tmp_path)
    fake_artifact(job.out, "0" * 64)
    assert reuse("android-arm64", None, tmp_path, ()) is None
    shutil.rmtree(job.out)
    fake_artifact(job.out, job.key)
    assert finished_key(job.out) == job.key
    (job.out / "model.pte").write_bytes(b"x" * 9)
    assert finished_key(job.out) is None and reuse("android-arm64", None, tmp_path, ()) is None


def test_force_builds_even_when_up_to_date(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import exporter.build.pipeline

    job = plan_job("android-arm64", out=tmp_path)
    fake_artifact(job.out, job.key)
    calls: list[dict[str, object]] = []

    def fake_build(*args: object, **kwargs: object) -> Path:
        calls.append(kwargs)
        return job.out

    monkeypatch.setattr(exporter.build.pipeline, "build", fake_build)
    runner = CliRunner()
    up_to_date = runner.invoke(main, ["build", "android-arm64", "--out", str(tmp_path)])
    assert up_to_date.exit_code == 0 and "up to date" in up_to_date.stderr and calls == []
    forced = runner.invoke(main, ["build", "android-arm64", "--out", str(tmp_path), "--force"])
    assert forced.exit_code == 0 and "up to date" not in forced.stderr and calls == [{"force": True}]


def test_library_build_reuses_before_reading_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import exporter.build.pipeline

    def refuse(*args: object) -> None:
        raise AssertionError("a reused build must not prepare")

    job = plan_job("android-arm64", out=tmp_path)
    fake_artifact(job.out, job.key)
    monkeypatch.setattr(exporter.build.pipeline, "prepare", refuse)
    assert exporter.build.pipeline.build("android-arm64", out=tmp_path) == job.out
    with pytest.raises(AssertionError, match="must not prepare"):
        exporter.build.pipeline.build("android-arm64", out=tmp_path, force=True)


def test_cache_folder_stores_and_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    monkeypatch.setenv(plan.CACHE_ENV, str(store))
    job = plan_job("android-arm64", out=tmp_path / "a")
    fake_artifact(job.out, job.key)
    assert remember(job.out) == job.out
    assert finished_key(store / job.key) == job.key
    elsewhere = reuse("android-arm64", None, tmp_path / "b", ())
    assert elsewhere is not None and elsewhere.folder == tmp_path / "b" / "pycode-4m" / "android-arm64"
    assert finished_key(elsewhere.folder) == job.key
    assert (elsewhere.folder / "model.pte").read_bytes() == (job.out / "model.pte").read_bytes()
    assert cache.cache_dir() == store and (store / "digests.json").is_file()


def test_an_artifact_found_in_place_is_copied_into_a_new_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = plan_job("android-arm64", out=tmp_path / "a")
    fake_artifact(job.out, job.key)
    monkeypatch.setenv(plan.CACHE_ENV, str(tmp_path / "store"))
    assert not (tmp_path / "store" / job.key).exists()
    assert reuse("android-arm64", None, tmp_path / "a", ()) is not None
    assert finished_key(tmp_path / "store" / job.key) == job.key


@pytest.mark.slow
def test_a_real_build_records_its_key_and_is_reused(tiny_checkpoint: Path, tiny_artifact: Path) -> None:
    """The session's tiny build (conftest) carries the key the plan computes, and a second build of
    the same job returns at once."""
    from exporter.build.pipeline import build

    overrides = ("export.max_seq_len=128", "validation.eval_tokens=64")  # conftest's tiny_artifact
    out = tiny_artifact.parent.parent
    job = plan_job("reference-fp32", tiny_checkpoint, out, overrides)
    assert json.loads((tiny_artifact / "manifest.json").read_text())["build_key"] == job.key
    assert build("reference-fp32", tiny_checkpoint, out, overrides) == tiny_artifact


def test_workflow_reads_only_fields_the_plan_writes() -> None:
    """The CI workflow parses, builds from the plan's matrix and names only fields each entry has."""
    import re

    import yaml

    text = (ROOT / ".github" / "workflows" / "artifacts.yml").read_text()
    jobs = yaml.safe_load(text)["jobs"]
    assert jobs["build"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert "exporter plan --out artifacts --json" in jobs["plan"]["steps"][-1]["run"]
    used = set(re.findall(r"matrix\.(\w+)", text))
    (entry, *_) = plan.matrix(plan_jobs(out=Path("artifacts")))["include"]
    assert used and used <= set(entry), used - set(entry)


def test_makefile_has_one_target_per_job(tmp_path: Path) -> None:
    jobs = plan_jobs(
        recipes=("ios-arm64", "linux-arm64"), out=tmp_path, overrides=("export.max_seq_len=256",)
    )
    text = plan.makefile(jobs)
    for job in jobs:
        assert f"\n{job.out}:\n\t$(EXPORTER) build {job.recipe} " in text
    assert text.count("--set export.max_seq_len=256") == 2
    done = subprocess.run(
        ["make", "-n", "-f", "-", "EXPORTER=exporter"], input=text, capture_output=True, text=True, check=True
    )
    assert done.stdout.count("exporter build ") == 2
