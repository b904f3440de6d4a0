"""Stub shared objects for the CUDA libraries the aarch64 torch wheel links.

The aarch64 torch wheel on PyPI is a CUDA build; its libraries name libcudart, libcupti, ... as
NEEDED and bind some of their symbols at load time. On a CPU run only torch.cuda.is_available()
calls them, so a stub with the right soname, version nodes and symbol names (each returning CUDA's
"no device" status) satisfies the dynamic loader.
"""

from __future__ import annotations

import re
from pathlib import Path

# library soname -> version node -> symbols the wheels' libraries bind from it
Needs = dict[str, dict[str, set[str]]]


UNVERSIONED = ""  # the node of symbols bound without a version


def read_needs(readelf_output: str) -> tuple[Needs, set[str]]:
    """From ``readelf -d -V --dyn-syms -W`` of one file: its NEEDED libraries, the version nodes it asks
    of each and the undefined symbols it binds under each node, and the symbols the file defines.
    Strong undefined symbols without a version are listed under every needed library, node
    ``UNVERSIONED``: the caller keeps only those no real library defines."""
    libs = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf_output)
    needs: Needs = {lib: {} for lib in libs}
    owner: dict[str, str] = {}  # version node -> library
    current = None
    for line in readelf_output.splitlines():
        if m := re.search(r"File: (\S+)", line):
            current = m.group(1)
        elif current and (m := re.search(r"Name: (\S+)\s+Flags", line)):
            owner[m.group(1)] = current
            needs.setdefault(current, {}).setdefault(m.group(1), set())
    defined, unversioned = set(), set()
    for bind, ndx, name in re.findall(
        r"^\s*\d+: \S+\s+\d+\s+\S+\s+(GLOBAL|WEAK)\s+\S+\s+(\S+) (\S+)", readelf_output, re.M
    ):
        symbol, _, node = name.partition("@")
        node = node.lstrip("@").split(" ")[0]
        if ndx != "UND":
            defined.add(symbol)
        elif node in owner:
            needs[owner[node]][node].add(symbol)
        elif not node and bind == "GLOBAL":
            unversioned.add(symbol)
    for lib in libs:
        needs[lib][UNVERSIONED] = set(unversioned)
    return needs, defined


def merge_needs(into: Needs, more: Needs) -> None:
    for lib, nodes in more.items():
        for node, symbols in nodes.items():
            into.setdefault(lib, {}).setdefault(node, set()).update(symbols)
        into.setdefault(lib, {})


def version_script(nodes: dict[str, set[str]]) -> str:
    """A linker version script that puts each symbol under its node (unversioned ones under the first
    named node, which makes it their default version, or under no node when there is none)."""
    named = {node: set(symbols) for node, symbols in sorted(nodes.items()) if node != UNVERSIONED}
    loose = nodes.get(UNVERSIONED, set())
    if not named:
        return f"{{ {exports(loose)}local: *; }};\n"
    named[next(iter(named))].update(loose)
    return "".join(f"{node} {{ {exports(symbols)}local: *; }};\n" for node, symbols in named.items())


def exports(symbols: set[str]) -> str:
    return f"global: {''.join(f'{s}; ' for s in sorted(symbols))}" if symbols else ""


# cudaErrorNoDevice and CUDA_ERROR_NO_DEVICE: torch.cuda.is_available() asks cudaGetDeviceCount, and
# reads this status as "no GPU" (a stub returning garbage made it decode a garbage error string).
NO_DEVICE = 100


def stub_source(symbols: set[str]) -> str:
    """AArch64 assembly defining every symbol as a function that returns "no device" at once."""
    lines = [".text"]
    for s in sorted(symbols):
        lines += [f".globl {s}", f".type {s}, %function", f"{s}:", f"    mov w0, #{NO_DEVICE}", "    ret"]
    return "\n".join(lines) + "\n"


def build_commands(name: str, work: Path, out: Path) -> list[list[str]]:
    """The cross-binutils calls that turn ``work/NAME.s`` and ``work/NAME.map`` into ``out``."""
    obj, src, script = work / f"{name}.o", work / f"{name}.s", work / f"{name}.map"
    return [
        ["aarch64-linux-gnu-as", str(src), "-o", str(obj)],
        [
            "aarch64-linux-gnu-ld",
            "-shared",
            f"-soname={name}",
            f"--version-script={script}",
            "-o",
            str(out),
            str(obj),
        ],
    ]
