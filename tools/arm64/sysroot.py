"""An aarch64 sysroot that runs our ``.pte`` files under qemu-user: Debian's Python 3.11 for arm64,
the aarch64 wheels of the same torch / executorch / torchao as this environment, and stubs for the
CUDA libraries the aarch64 torch wheel links.

Every step is idempotent and leaves a stamp file, so a second set-up costs a few checks. Nothing of
the system is changed: apt runs with a private state, cache and sources folder under the root.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.errors import ExporterError

from .stubs import UNVERSIONED, Needs, build_commands, merge_needs, read_needs, stub_source, version_script

# python3.11 lives in bookworm; the stdlib of the emulated Python must match the wheels' cp311 tag.
DEBIAN_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# python3.11's closure plus what the wheels' native code links (C++ runtime, OpenMP, atomics); the
# stamp names their count, so a cache made with fewer roots is completed.
DEBIAN_ROOTS = ("python3.11", "libstdc++6", "libgomp1", "libatomic1")
WHEEL_PLATFORM = "manylinux_2_28_aarch64"
# Same versions as the x86 side: a difference between the two runs must come from the CPU.
PINNED_FROM_HOST = ("torch", "executorch", "torchao")
# Pure-Python (or small native) packages that importing the ExecuTorch runtime pulls in.
RUNTIME_DEPS = (
    "numpy",
    "sympy",
    "mpmath",
    "networkx",
    "jinja2",
    "markupsafe",
    "filelock",
    "flatbuffers",
    "ruamel.yaml",
    "tabulate",
    "tqdm",
    "typing_extensions",
    "fsspec",
    "packaging",
)
READELF = ("aarch64-linux-gnu-readelf", "-d", "-V", "--dyn-syms", "-W")
REQUIRED_TOOLS = {
    "qemu-aarch64-static": "qemu-user-static",
    "aarch64-linux-gnu-as": "binutils-aarch64-linux-gnu",
    "aarch64-linux-gnu-ld": "binutils-aarch64-linux-gnu",
    "aarch64-linux-gnu-readelf": "binutils-aarch64-linux-gnu",
    "apt-get": "apt",
    "dpkg-deb": "dpkg",
}


class Arm64SetupError(ExporterError):
    """The emulator, a cross tool or a download the ARM64 check needs is missing or failed."""


@dataclass(frozen=True)
class Sysroot:
    root: Path  # the cache folder: downloads, apt state, stamps
    sysroot: Path  # what ``qemu-aarch64-static -L`` serves
    site: Path  # the aarch64 wheels, put on the emulated Python's PYTHONPATH
    qemu: str

    @property
    def python(self) -> Path:
        return self.sysroot / "usr" / "bin" / "python3.11"


def default_root() -> Path:
    env = os.environ.get("EXPORTER_ARM64_ROOT")
    return Path(env) if env else Path.home() / ".cache" / "exporter" / "arm64"


def check_tools() -> None:
    """One line naming the Debian packages to install when a tool is missing."""
    missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise Arm64SetupError(
            None, f"missing tools; install them with: apt-get install -y {' '.join(missing)}"
        )


def run_tool(args: Sequence[str | Path], cwd: Path | None = None) -> str:
    try:
        done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise Arm64SetupError(None, f"cannot run {args[0]}: {e}") from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise Arm64SetupError(None, f"{' '.join(str(a) for a in args[:3])} ... failed: {last}")
    return done.stdout


def stamped(root: Path, name: str, step: Callable[[], None]) -> bool:
    """Run ``step`` unless its stamp exists; True when it ran."""
    stamp = root / "stamps" / name
    if stamp.exists():
        return False
    step()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    return True


def apt_options(root: Path) -> list[str]:
    """apt-get/apt-cache options for a private arm64-only apt: no system state is read or written."""
    apt = root / "apt"
    return [
        f"-oDir::State={apt / 'state'}",
        f"-oDir::State::status={apt / 'state' / 'status'}",
        f"-oDir::Cache={apt / 'cache'}",
        f"-oDir::Etc::SourceList={apt / 'sources.list'}",
        f"-oDir::Etc::SourceParts={apt / 'sources.list.d'}",
        "-oDir::Etc::Preferences=/dev/null",
        f"-oDir::Etc::PreferencesParts={apt / 'preferences.d'}",
        "-oAPT::Architecture=arm64",
        "-oAPT::Architectures::=arm64",
        "-oDebug::NoLocking=true",
    ]


def apt_update(root: Path) -> None:
    apt = root / "apt"
    for sub in ("state/lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "state" / "status").touch()
    mirror = os.environ.get("EXPORTER_ARM64_DEBIAN_MIRROR", DEFAULT_MIRROR)
    (apt / "sources.list").write_text(
        f"deb [arch=arm64 signed-by={DEBIAN_KEYRING}] {mirror} {DEBIAN_SUITE} main\n"
    )
    run_tool(["apt-get", *apt_options(root), "-q", "update"])


def package_closure(apt_cache_output: str) -> list[str]:
    """Real package names from ``apt-cache depends --recurse`` (virtual ones are shown as <name>)."""
    names = {line.strip() for line in apt_cache_output.splitlines() if line and not line[0].isspace()}
    return sorted(n for n in names if not n.startswith("<"))


def unpack_debian(root: Path, sysroot: Path) -> None:
    flags = [
        "--no-recommends",
        "--no-suggests",
        "--no-conflicts",
        "--no-breaks",
        "--no-replaces",
        "--no-enhances",
    ]
    out = run_tool(["apt-cache", *apt_options(root), "depends", "--recurse", *flags, *DEBIAN_ROOTS])
    debs = root / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    run_tool(["apt-get", *apt_options(root), "-q", "download", *package_closure(out)], cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        run_tool(["dpkg-deb", "-x", deb, sysroot])
    relativize_links(sysroot)


def relativize_links(sysroot: Path) -> None:
    """Absolute symlinks (``/lib/ld-linux-aarch64.so.1`` -> ``/lib/aarch64-linux-gnu/...``) would point
    into the host; make them point inside the sysroot."""
    for path in sysroot.rglob("*"):
        if path.is_symlink() and os.readlink(path).startswith("/"):
            target = sysroot / os.readlink(path).lstrip("/")
            path.unlink()
            path.symlink_to(os.path.relpath(target, path.parent))


def host_version(package: str) -> str:
    return importlib.metadata.version(package).split("+")[0]  # 2.13.0+cpu -> 2.13.0


def install_wheels(site: Path) -> None:
    pins = [f"{p}=={host_version(p)}" for p in (*PINNED_FROM_HOST, *RUNTIME_DEPS)]
    target: list[str | Path] = ["--target", site, "--platform", WHEEL_PLATFORM, "--python-version", "3.11"]
    wheel_only = ["--implementation", "cp", "--abi", "cp311", "--only-binary=:all:", "--no-deps"]
    run_tool([sys.executable, "-m", "pip", "install", "--quiet", "--upgrade", *target, *wheel_only, *pins])


def missing_libraries(site: Path, sysroot: Path) -> Needs:
    """Libraries the wheels' native code links that neither the wheels nor the sysroot ship (the
    CUDA runtime of the aarch64 torch wheel), with what is bound from each."""
    stubbed = {p.stem for p in (sysroot.parent / "stub-build").glob("*.map")}  # earlier runs' stubs
    present = {p.name for base in (site, sysroot) for p in base.rglob("*.so*")} - stubbed
    needs: Needs = {}
    defined: set[str] = set()
    for lib in sorted(site.rglob("*.so*")):
        if lib.is_file() and not lib.is_symlink():
            file_needs, file_defines = read_needs(run_tool([*READELF, lib]))
            merge_needs(needs, file_needs)
            defined |= file_defines
    # The Python C API (defined by the interpreter) and the system libraries must never be stubbed.
    system = [sysroot / "usr/bin/python3.11", *(sysroot / "usr/lib/aarch64-linux-gnu").glob("*.so*")]
    for lib in system:
        if lib.is_file() and not lib.is_symlink() and lib.name not in stubbed:
            defined |= read_needs(run_tool([*READELF, lib]))[1]
    missing = {lib: nodes for lib, nodes in needs.items() if lib not in present}
    for nodes in missing.values():
        nodes[UNVERSIONED] = nodes.get(UNVERSIONED, set()) - defined
    return missing


def write_stubs(sysroot: Path, missing: Needs) -> None:
    libdir = sysroot / "usr" / "lib" / "aarch64-linux-gnu"
    work = sysroot.parent / "stub-build"
    work.mkdir(parents=True, exist_ok=True)
    for name, nodes in missing.items():
        (work / f"{name}.s").write_text(stub_source(set().union(*nodes.values())))
        (work / f"{name}.map").write_text(version_script(nodes))
        for command in build_commands(name, work, libdir / name):
            run_tool(command)


def write_stub_step(site: Path, sysroot: Path) -> None:
    write_stubs(sysroot, missing_libraries(site, sysroot))


def set_up(root: Path | None = None, log: Callable[[str], None] = print) -> Sysroot:
    """The cached sysroot, made or completed as needed."""
    check_tools()
    root = (root or default_root()).resolve()
    sysroot, site = root / "sysroot", root / "sysroot" / "opt" / "site-packages"
    for name, step in (
        ("apt-update", lambda: apt_update(root)),
        (f"debian-{len(DEBIAN_ROOTS)}-roots", lambda: unpack_debian(root, sysroot)),
        ("wheels", lambda: install_wheels(site)),
        ("stubs-no-device", lambda: write_stub_step(site, sysroot)),  # renamed when stubs change
    ):
        start = time.perf_counter()
        if stamped(root, name, step):
            log(f"arm64 set-up: {name} done in {time.perf_counter() - start:.1f} s")
    qemu = shutil.which("qemu-aarch64-static")
    assert qemu is not None  # check_tools
    return Sysroot(root, sysroot, site, qemu)
