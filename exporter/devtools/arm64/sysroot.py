"""An aarch64 sysroot that runs our ``.pte`` files under qemu-user: Debian's Python 3.11 for arm64,
the aarch64 wheels of the same torch / executorch / torchao as this environment, and stubs for the
CUDA libraries the aarch64 torch wheel links.

Every step is idempotent and leaves a stamp file, so a second set-up costs a few checks. Nothing of
the system is changed: apt runs with a private state, cache and sources folder under the root.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.errors import ExporterError

# python3.11 lives in bookworm; the stdlib of the emulated Python must match the wheels' cp311 tag.
DEBIAN_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# python3.11's closure plus what the wheels' native code links (C++ runtime, OpenMP).
DEBIAN_ROOTS = ("python3.11", "libstdc++6", "libgomp1")
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


def needed_versions(readelf_output: str) -> dict[str, set[str]]:
    """From ``readelf -d -V``: every NEEDED library and the version nodes the file asks of it."""
    needed: dict[str, set[str]] = {}
    for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf_output):
        needed.setdefault(lib, set())
    current = None
    for line in readelf_output.splitlines():
        if m := re.search(r"File: (\S+)", line):
            current = m.group(1)
        elif current and (m := re.search(r"Name: (\S+)\s+Flags", line)):
            needed.setdefault(current, set()).add(m.group(1))
    return needed


def version_script(nodes: set[str]) -> str:
    return "".join(f"{node} {{ }};\n" for node in sorted(nodes)) or "{ };\n"


def missing_libraries(site: Path, sysroot: Path) -> dict[str, set[str]]:
    """Libraries the wheels' native code links that neither the wheels nor the sysroot ship (the
    CUDA runtime of the aarch64 torch wheel), with the version nodes asked of each."""
    present = {p.name for base in (site, sysroot) for p in base.rglob("*.so*")}
    missing: dict[str, set[str]] = {}
    for lib in sorted(site.rglob("*.so*")):
        if not lib.is_file() or lib.is_symlink():
            continue
        out = run_tool(["aarch64-linux-gnu-readelf", "-d", "-V", "-W", lib])
        for name, nodes in needed_versions(out).items():
            if name not in present:
                missing.setdefault(name, set()).update(nodes)
    return missing


def write_stubs(sysroot: Path, missing: dict[str, set[str]]) -> None:
    """Empty shared objects with the right soname and version nodes: enough for the dynamic loader,
    and nothing calls into CUDA on a CPU run."""
    libdir = sysroot / "usr" / "lib" / "aarch64-linux-gnu"
    work = sysroot.parent / "stub-build"
    work.mkdir(parents=True, exist_ok=True)
    empty = work / "empty.o"
    (work / "empty.s").write_text("")
    run_tool(["aarch64-linux-gnu-as", work / "empty.s", "-o", empty])
    for name, nodes in missing.items():
        script = work / f"{name}.map"
        script.write_text(version_script(nodes))
        run_tool(
            [
                "aarch64-linux-gnu-ld",
                "-shared",
                f"-soname={name}",
                f"--version-script={script}",
                "-o",
                libdir / name,
                empty,
            ]
        )


def write_stub_step(site: Path, sysroot: Path) -> None:
    write_stubs(sysroot, missing_libraries(site, sysroot))


def set_up(root: Path | None = None, log: Callable[[str], None] = print) -> Sysroot:
    """The cached sysroot, made or completed as needed."""
    check_tools()
    root = (root or default_root()).resolve()
    sysroot, site = root / "sysroot", root / "sysroot" / "opt" / "site-packages"
    for name, step in (
        ("apt-update", lambda: apt_update(root)),
        ("debian", lambda: unpack_debian(root, sysroot)),
        ("wheels", lambda: install_wheels(site)),
        ("stubs", lambda: write_stub_step(site, sysroot)),
    ):
        start = time.perf_counter()
        if stamped(root, name, step):
            log(f"arm64 set-up: {name} done in {time.perf_counter() - start:.1f} s")
    qemu = shutil.which("qemu-aarch64-static")
    assert qemu is not None  # check_tools
    return Sysroot(root, sysroot, site, qemu)
