"""Publishing: the per-target lock across processes, cleanup and recovery after killed builds, the
durable swap, and real builds killed with SIGKILL at stage boundaries and at seeded moments."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exporter.artifact.publish import (
    current_umask,
    is_whole,
    leftovers,
    lock_path,
    make_staging,
    publish,
    target_lock,
)
from exporter.build.pipeline import DEFAULT_CHECKPOINT
from exporter.errors import ExporterError

# A child that holds a target's lock until its stdin says so (or runs into it, logging to stderr).
HOLDER = """
import logging, sys
from pathlib import Path
from exporter.artifact.publish import target_lock
logging.basicConfig(level=logging.INFO, format="%(message)s")
with target_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""

# A child that publishes fake artifacts under a target in a loop, the way builds do, until killed.
PUBLISHER = """
import hashlib, json, sys
from pathlib import Path
from exporter.artifact.publish import make_staging, publish, target_lock
target, n = Path(sys.argv[1]), 0
while True:
    n += 1
    with target_lock(target):
        staging = make_staging(target)
        model, tokenizer = f"build {n}".encode() * 50_000, b"{}"
        (staging / "model.pte").write_bytes(model)
        (staging / "tokenizer.json").write_bytes(tokenizer)
        manifest = {
            "artifact": {"file": "model.pte", "sha256": hashlib.sha256(model).hexdigest()},
            "tokenizer": {"sha256": hashlib.sha256(tokenizer).hexdigest()},
        }
        (staging / "manifest.json").write_text(json.dumps(manifest))
        print(n, flush=True)
        publish(staging, target)
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_artifact(folder: Path, payload: bytes) -> Path:
    """A published folder's shape: model file, tokenizer, manifest with both files' sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pte").write_bytes(payload)
    (folder / "tokenizer.json").write_text(json.dumps({"payload": len(payload)}))
    manifest = {
        "artifact": {"file": "model.pte", "sha256": sha256(folder / "model.pte")},
        "tokenizer": {"sha256": sha256(folder / "tokenizer.json")},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def assert_whole(folder: Path) -> dict[str, object]:
    """The folder is a complete artifact: every file its manifest lists matches its sha256, and it
    holds nothing else."""
    manifest = json.loads((folder / "manifest.json").read_text())
    listed = {name: entry["sha256"] for name, entry in manifest.get("files", {}).items()}
    listed[manifest["artifact"]["file"]] = manifest["artifact"]["sha256"]
    listed["tokenizer.json"] = manifest["tokenizer"]["sha256"]
    assert {name: sha256(folder / name) for name in listed} == listed
    extra = {p.name for p in folder.iterdir()} - set(listed) - {"manifest.json", "build-info.json"}
    assert not extra, f"unlisted files in {folder}: {extra}"
    return manifest


def start_holder(target: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_build_of_the_same_target_waits_for_the_first(tmp_path: Path) -> None:
    target = tmp_path / "model" / "recipe"
    first = start_holder(target)
    assert first.stdout is not None and first.stdin is not None
    assert first.stdout.readline() == "held\n"
    second = start_holder(target)
    assert second.stderr is not None and second.stdout is not None
    # blocks until the second child logs that it waits ("" if it ended without)
    while not (waiting := second.stderr.readline()).startswith("waiting") and waiting:
        pass
    assert waiting.startswith(f"waiting for another build of {target}")
    assert second.poll() is None  # still waiting: the first holds the lock
    first.stdin.write("\n")
    first.stdin.flush()
    assert first.stdout.readline() == "released\n"
    out, _ = second.communicate(input="\n", timeout=60)
    assert out.splitlines() == ["held", "released"]
    assert first.wait(timeout=60) == 0 and second.returncode == 0


def test_waiting_gives_up_with_one_line_and_other_targets_do_not_wait(tmp_path: Path) -> None:
    target = tmp_path / "model" / "recipe"
    holder = start_holder(target)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline() == "held\n"
        expiry = pytest.raises(ExporterError, match="another build of this target still runs")
        with expiry as caught, target_lock(target, timeout_s=0.2):
            pytest.fail("took a lock another process holds")
        assert caught.value.path == lock_path(target) and "\n" not in str(caught.value)
        with target_lock(target.with_name("other-recipe"), timeout_s=0):
            pass
    finally:
        holder.communicate(input="\n", timeout=60)


def test_the_lock_timeout_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPORTER_LOCK_TIMEOUT_S", "soon")
    refused = pytest.raises(ExporterError, match="EXPORTER_LOCK_TIMEOUT_S='soon' is not a number")
    with refused, target_lock(tmp_path / "m" / "r"):
        pass


# Processes that each take a target's lock many times and check that nobody else is inside.
CONTENDER = """
import os, sys
from pathlib import Path
from exporter.artifact.publish import target_lock
target, inside = Path(sys.argv[1]), Path(sys.argv[2])
for _ in range(int(sys.argv[3])):
    with target_lock(target, timeout_s=120):
        fd = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # raises if another holder is in
        os.close(fd)
        os.unlink(inside)
"""


def test_removing_the_lock_file_on_release_keeps_holders_exclusive(tmp_path: Path) -> None:
    """Each release unlinks the lock file while held; waiters on the old inode must retry on the
    path rather than enter beside a holder of the new one."""
    target, inside = tmp_path / "model" / "recipe", tmp_path / "inside"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, str(target), str(inside), "500"], stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=600)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(errors)
    assert not lock_path(target).exists() and not inside.exists()


def test_a_killed_holder_leaves_no_lock_behind(tmp_path: Path) -> None:
    target = tmp_path / "model" / "recipe"
    holder = start_holder(target)
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait(timeout=60)
    with target_lock(target, timeout_s=0):
        pass


def test_taking_the_lock_removes_what_killed_builds_left(tmp_path: Path) -> None:
    target = write_artifact(tmp_path / "model" / "recipe", b"published")
    before = {p.name: sha256(p) for p in target.iterdir()}
    staging = make_staging(target)
    (staging / "model.pte").write_bytes(b"half")
    write_artifact(target.with_name(".recipe.old-4242"), b"an older artifact")
    target.with_name(".recipe.failed.json.tmp-4242").write_text("{")
    other = write_artifact(target.with_name(".other.tmp-1"), b"another target's build")
    assert len(leftovers(target)) == 3
    with target_lock(target):
        assert leftovers(target) == []
    assert {p.name: sha256(p) for p in target.iterdir()} == before
    assert other.is_dir()  # another target's staging is its own build's business
    assert not lock_path(target).exists()  # removed on release, while still held


def test_a_target_absent_after_a_kill_between_the_renames_is_restored(tmp_path: Path) -> None:
    target = tmp_path / "model" / "recipe"
    old = write_artifact(target.with_name(".recipe.old-4242"), b"the previous artifact")
    files = {p.name: sha256(p) for p in old.iterdir()}
    staging = write_artifact(make_staging(target), b"the new artifact, not yet renamed")
    with target_lock(target):
        assert {p.name: sha256(p) for p in target.iterdir()} == files
        assert leftovers(target) == []
    assert not staging.exists()


def test_an_old_folder_that_is_not_whole_is_not_restored(tmp_path: Path) -> None:
    target = tmp_path / "model" / "recipe"
    old = write_artifact(target.with_name(".recipe.old-4242"), b"the previous artifact")
    (old / "model.pte").write_bytes(b"truncated")
    assert not is_whole(old)
    with target_lock(target):
        assert not target.exists() and leftovers(target) == []


def test_publish_syncs_every_file_and_folder_before_the_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = write_artifact(tmp_path / "model" / "recipe", b"old")
    staging = write_artifact(make_staging(target), b"new")
    (staging / "sub").mkdir()
    (staging / "sub" / "part.bin").write_bytes(b"nested")
    expected = {p.resolve() for p in [*staging.rglob("*"), staging]}
    synced: list[tuple[Path, bool]] = []  # (path, was the swap done yet)
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append((Path(os.readlink(f"/proc/self/fd/{fd}")), staging.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    publish(staging, target)
    before_swap = {path for path, staged in synced if staged}
    assert before_swap == expected
    assert synced[-1] == (target.parent.resolve(), False)  # the parent, after the rename
    assert sha256(target / "model.pte") == sha256_bytes(b"new")
    assert leftovers(target) == []


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_publishing_killed_at_seeded_moments_never_shows_a_partial_target(tmp_path: Path) -> None:
    """A child publishes in a loop and is killed at seeded moments; the target is then whole, or
    absent with a whole ``.old`` that taking the lock restores (the window the module names)."""
    target = tmp_path / "model" / "recipe"
    rng = random.Random(11)
    restored = 0
    for _ in range(12):
        child = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, str(target)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"  # imports done, the first build under way
        time.sleep(rng.uniform(0.0, 0.3))
        child.kill()
        child.wait(timeout=60)
        if target.exists():
            assert_whole(target)
        else:
            assert any(is_whole(p) for p in target.parent.glob(".recipe.old-*"))
            restored += 1
        with target_lock(target, timeout_s=0):
            assert_whole(target)
            assert leftovers(target) == []
    print(f"12 kills, {restored} between the two renames, all restored")


# --- real builds killed with SIGKILL -------------------------------------------------------------

# QAT and the mixed-precision plan switched off: the same stages and publishing, in a third of the
# time, so that seven kills fit in a few minutes on two cores.
BUILD = [
    "build",
    "android-arm64",
    "--force",
    "--set",
    "quantization.gptq=false",
]
STAGE_START = re.compile(r"^\[(\w+)\] \.\.\.$")
STAGE_DONE = re.compile(r"^\[(\w+)\] done in ")


class Build:
    """``python -m exporter build`` in its own process group, its stderr collected line by line."""

    def __init__(self, out: Path, checkpoint: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "EXPORTER_CACHE"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", *BUILD, "--checkpoint", str(checkpoint), "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for_line(self, start: str) -> bool:
        """Block until a line starting with ``start`` appears on stderr; False if the build ended first."""

        def seen() -> bool:
            return any(line.startswith(start) for line in self.lines)

        with self.changed:
            return self.changed.wait_for(lambda: seen() or not self.reader.is_alive()) and seen()

    def log(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> bool:
        """SIGKILL the build's process group; True if it was still running."""
        running = self.proc.poll() is None
        if running:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=120)
        self.reader.join(timeout=120)
        return running and self.proc.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_builds_killed_at_any_moment_leave_the_previous_artifact_whole(tmp_path: Path) -> None:
    # a copy of the shipped model: every build of the test reads the same bytes
    ckpt = Path(shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "ckpt" / DEFAULT_CHECKPOINT.name))
    out = tmp_path / "out"
    start = time.perf_counter()
    first = Build(out, ckpt)
    assert first.proc.wait(timeout=1800) == 0, first.log()
    first.reader.join(timeout=120)
    seconds = time.perf_counter() - start
    (target,) = (out / ckpt.name).glob("android-arm64")
    assert_whole(target)

    # every stage's start, then the last line before publishing, then seeded moments of a build
    stages = [line for line in first.lines if STAGE_START.match(line)]
    last_done = [line.split(" done in ")[0] for line in first.lines if STAGE_DONE.match(line)][-1]
    rng = random.Random(5)
    points: list[tuple[str, float]] = [(line, 0.0) for line in stages] + [(f"{last_done} done in ", 0.0)]
    points += [("", rng.uniform(0.05, 0.95) * seconds) for _ in range(2)]
    killed, cleaned, published, left = 0, 0, (target / "manifest.json").read_bytes(), set[str]()
    for line, delay in points:
        build = Build(out, ckpt)
        if line:
            assert build.wait_for_line(line), f"never logged {line!r}:\n{build.log()}"
            # the lock is taken before the first stage starts: what the last kill left is gone now
            assert not left & {p.name for p in target.parent.iterdir()}, build.log()
            cleaned += len(left)
        time.sleep(delay)
        killed += build.kill()
        assert build.proc.returncode in (0, -signal.SIGKILL), build.log()
        left = {p.name for p in target.parent.iterdir()} - {target.name, lock_path(target).name}
        if target.exists():
            assert_whole(target)
            if line in stages:  # killed before publishing: the previous artifact, byte for byte
                assert (target / "manifest.json").read_bytes() == published
            published = (target / "manifest.json").read_bytes()
        else:  # killed between the two renames: the whole previous artifact is beside it
            assert any(is_whole(p) for p in target.parent.glob(".android-arm64.old-*"))
    print(f"kill points: {killed} killed of {len(points)} tried, all survived; {cleaned} leftovers cleaned")

    last = Build(out, ckpt)
    assert last.proc.wait(timeout=1800) == 0, last.log()
    last.reader.join(timeout=120)
    assert_whole(target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["android-arm64"]
    assert killed >= len(stages)  # the stage-boundary kills all landed inside a running build
    assert cleaned >= len(stages)  # each left its staging folder, which the next build removed


def test_a_published_folder_is_readable_by_others(tmp_path: Path) -> None:
    target = tmp_path / "out" / "android-arm64"
    staging = make_staging(target)
    (staging / "model.pte").write_bytes(b"\0")
    publish(staging, target)
    assert target.stat().st_mode & 0o777 == 0o777 & ~current_umask()
