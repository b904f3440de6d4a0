"""The package's rooms follow the data path: no module imports one above it.

Ranks, top to bottom (a module may import its own room and any room below it; lazy imports inside
functions count too). The rooms and what each may import are also written in each sub-package's
``__init__.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RANKS = {
    "exporter.cli": 10,
    "exporter.__main__": 10,
    "exporter.measure": 9,
    "exporter.build": 8,
    "exporter.quant": 7,
    "exporter.gate": 6,
    "exporter.artifact": 5,
    "backends": 4,
    "exporter.model": 3,
    "exporter.recipe": 2,
    "exporter.plumbing": 1,
    "exporter.errors": 0,
    "exporter": 0,  # the package's own __init__ (version, docstring)
}
MAX_FLAT = 5  # modules directly in exporter/


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    """The longest prefix of ``module`` that names a room."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in RANKS:
            return ".".join(parts[:i])
    raise AssertionError(f"{module} is in no room; add it to RANKS")


def imported_modules(source: str, module: str, is_package: bool) -> list[str]:
    """Every module of ours that ``source`` imports, relative imports resolved, ``from P import m``
    counted as ``P.m``."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found += [f"{target}.{alias.name}" for alias in node.names]
    return [m for m in found if m.split(".")[0] in ("exporter", "backends", "tools")]


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    own = RANKS[room(module)]
    bad = []
    for target in imported_modules(source, module, is_package):
        if target.split(".")[0] == "tools":
            bad.append(f"{module} imports the development tool {target}")
        elif RANKS[room(target)] > own:
            bad.append(f"{module} ({room(module)}) imports {target} ({room(target)}), above it")
        elif module.startswith("backends") and target.startswith("exporter.model"):
            bad.append(f"{module}: backends never import the model ({target})")
    return bad


def package_files() -> list[Path]:
    return sorted([*ROOT.glob("exporter/**/*.py"), *ROOT.glob("backends/**/*.py")])


def test_no_module_imports_one_above_it() -> None:
    bad = []
    for path in package_files():
        bad += violations(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("exporter.model.transformer", "from ..quant.configs import quantize_model"),
        ("exporter.artifact.verify", "def f():\n    from exporter.gate import steppers"),
        ("exporter.plumbing.progress", "import exporter.recipe"),
        ("backends.xnnpack.lower", "from exporter.model.transformer import Transformer"),
        ("exporter.build.pipeline", "from tools import peer"),
    ],
)
def test_the_check_finds_an_upward_import(module: str, source: str) -> None:
    assert violations(source, module)


def test_downward_and_same_room_imports_pass() -> None:
    source = "from .checkpoint import load_model\nfrom ..recipe import Recipe"
    assert not violations(source, "exporter.model.x")
    assert not violations("from ..gate.steppers import greedy", "exporter.quant.tune")


def test_rooms_say_what_they_hold_and_may_import() -> None:
    for init in sorted(ROOT.glob("exporter/*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "May import" in doc, f"{init.relative_to(ROOT)}: docstring must say what it may import"


def test_few_flat_modules_and_no_stdlib_names() -> None:
    flat = sorted(p.name for p in (ROOT / "exporter").glob("*.py"))
    assert len(flat) <= MAX_FLAT, flat
    names = {p.stem for p in package_files()} - {"__init__", "__main__"}
    assert not names & sys.stdlib_module_names, names & sys.stdlib_module_names


def test_the_wheel_leaves_the_development_tools_out() -> None:
    import tomllib

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["exporter*", "backends*"]
    assert (ROOT / "tools" / "__init__.py").is_file() and not (ROOT / "exporter" / "tools").exists()
