"""Publishing an artifact folder: staging, one build per target, a durable swap, crash recovery.

Beside a target ``T`` (``artifacts/<model>/<recipe>``) in its parent folder live, hidden:

- ``.T.lock``      the per-target lock (``filelock``: ``flock`` on POSIX), held for a whole build
                   and removed at its end (a killed build leaves it; it blocks nobody);
- ``.T.tmp-XXXX``  the staging folder a build writes into;
- ``.T.old-PID``   the previous artifact, for the moment between the two renames of the swap.

What holds, for builds that go through ``target_lock`` (as ``pipeline.build`` does):

1. One build of ``T`` at a time. A second build of the same target waits (and says so) until the
   first ends, however it ends: the kernel drops a ``flock`` when its process dies, so a killed
   build never leaves the lock held (only its file). It gives up after ``LOCK_TIMEOUT_S`` seconds (environment
   ``EXPORTER_LOCK_TIMEOUT_S``) with a one-line error. Builds of different targets never wait.
2. Killed at any moment (SIGKILL, OOM), a build leaves ``T`` as it was or holding the whole new
   artifact, except in one window: between ``rename(T, .T.old-PID)`` and
   ``rename(.T.tmp-XXXX, T)`` the name ``T`` is absent while ``.T.old-PID`` holds the whole
   previous artifact. The next build of ``T`` (or ``target_lock``) puts that folder back under
   ``T`` before it does anything else, if its files match its manifest's sha256. Nothing partial
   is ever visible under ``T``: a folder gets that name only by a rename of a finished folder.
3. Power loss: every file of the staging folder and the folder itself are fsynced before the
   rename, and the parent folder after it, so once ``publish`` returns the new artifact is on disk
   whole; before that the old one is (or, after the first rename only, ``.T.old-PID``, recovered
   as in 2). This assumes a file system that honours fsync and keeps renames in order (ext4,
   XFS, btrfs; not every network file system, where ``flock`` may not hold either; on macOS
   ``fsync`` does not flush the drive's cache).
4. Leftovers of killed builds (``.T.tmp-*``, ``.T.old-*``, half-written ``.T.failed.json``) are
   removed when the next build of ``T`` takes the lock: holding it, no live build owns them.

Not guaranteed: a reader resolving ``T`` inside the window of 2 finds nothing and must retry (an
atomic exchange would need ``renameat2(RENAME_EXCHANGE)``, which Python's standard library lacks);
a reader that already opened the old files keeps reading them. Tools that write into a published
folder without the lock (``exporter eval``'s manifest merge) can lose their write to a swap.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import ExporterError

log = logging.getLogger("exporter")

# A build of a large model takes tens of minutes; a waiter outlasting two of them is stuck.
LOCK_TIMEOUT_S = 3600.0
LOCK_TIMEOUT_ENV = "EXPORTER_LOCK_TIMEOUT_S"


def lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


def leftovers(target: Path) -> list[Path]:
    """Hidden entries that builds of ``target`` make and remove again; the lock file is not one."""
    names = (f".{target.name}.tmp-*", f".{target.name}.old-*", f".{target.name}.failed.json.tmp-*")
    return sorted(p for pattern in names for p in target.parent.glob(pattern))


def lock_timeout() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV)
    if raw is None:
        return LOCK_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        raise ExporterError(None, f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None


@contextmanager
def target_lock(target: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Hold ``target``'s lock for the block; on taking it, recover and clean what killed builds left."""
    timeout = lock_timeout() if timeout_s is None else timeout_s
    path = lock_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(path)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log.info(
                "waiting for another build of %s to finish (lock %s, up to %.0f s)", target, path, timeout
            )
            lock.acquire(timeout=timeout)
    except Timeout:
        raise ExporterError(
            path,
            f"another build of this target still runs after {timeout:.0f} s; "
            f"wait for it to finish or set {LOCK_TIMEOUT_ENV} higher",
        ) from None
    except OSError as e:
        raise ExporterError(target.parent, f"output folder is not writable ({e.strerror})") from e
    try:
        recover(target)
        remove_leftovers(target)
        yield
    finally:
        # Unlinked while still held, so a finished build leaves no lock file: a waiter that then
        # takes the unlinked inode sees it has no name and retries on the path (filelock checks
        # st_nlink after flock; tested with concurrent processes in tests/test_publish.py).
        with suppress(OSError):
            path.unlink()
        lock.release()


def recover(target: Path) -> Path | None:
    """Put a whole ``.old`` folder back under ``target`` if a build was killed mid-swap; call with
    the lock held. Returns the folder it put back."""
    if target.exists():
        return None
    olds = [p for p in target.parent.glob(f".{target.name}.old-*") if is_whole(p)]
    if not olds:
        return None
    newest = max(olds, key=lambda p: p.stat().st_mtime_ns)
    newest.rename(target)
    fsync_path(target.parent)
    log.info("restored %s from %s, left by a build killed while publishing", target, newest.name)
    return newest


def is_whole(folder: Path) -> bool:
    """Its manifest reads and every file it lists (model file, tokenizer, any ``files`` entry)
    matches its sha256."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        listed = {name: entry["sha256"] for name, entry in manifest.get("files", {}).items()}
        listed[manifest["artifact"]["file"]] = manifest["artifact"]["sha256"]
        listed["tokenizer.json"] = manifest["tokenizer"]["sha256"]
        return all(file_sha256(folder / name) == digest for name, digest in listed.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def remove_leftovers(target: Path) -> None:
    """Remove staging, old and temporary files of earlier builds; call with the lock held."""
    for path in leftovers(target):
        log.info("removing %s, left by an interrupted build", path.name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def make_staging(target: Path) -> Path:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        # mkdtemp makes the folder private (0700); the published artifact gets the mode any folder
        # made here would have, so other users and CI steps running as another user can read it
        os.chmod(staging, 0o777 & ~current_umask())
        return staging
    except OSError as e:
        raise ExporterError(target.parent, f"output folder is not writable ({e.strerror})") from e


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish(staging: Path, target: Path) -> None:
    """Swap the finished folder into place durably; the old artifact survives until the new one is
    there (see the module docstring for the window between the renames)."""
    fsync_tree(staging)
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        target.rename(old)
    staging.rename(target)
    fsync_path(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` and every folder, deepest first (``folder`` last)."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            fsync_path(Path(root) / name)
        fsync_path(Path(root))


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
