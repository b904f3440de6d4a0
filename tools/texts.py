"""Regenerate the shipped texts in ``exporter/data/texts/`` from CPython's standard library.

Every text is verbatim CPython 3.11 (PSF licence), frozen in the repository so that a gate, an
evaluation or a calibration gives the same figures on any machine, whatever its Python:

- ``prose.txt`` (held out): the reference-manual topic "import" (``pydoc_data.topics``);
- ``code.txt`` (held out): the modules ``bisect`` and ``colorsys``;
- ``calibration.txt``: what the tuning reads by default: other reference-manual topics and other
  modules, interleaved a section at a time;
- ``calibration-mixed.txt``: the same two kinds and two more sources, interleaved about 3,000
  characters at a time: English paragraphs of other PyPI packages' READMEs and other packages'
  Python sources (none of them a source of the judging texts below). Measured worse on those
  judging texts than ``calibration.txt`` (docs/quality.md), so no recipe reads it by default.

No text used for calibration or training shares a paragraph with a held-out text (the gate's
``prose-and-code`` included); ``disjoint`` checks it and ``tests/tools/test_texts.py`` runs it.

    python -m tools.texts     # rewrites the files (run under CPython 3.11)
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import exporter
from exporter.recipe import TRAINING_TEXTS

TEXTS = Path(exporter.__file__).resolve().parent / "data" / "texts"

PROSE_TOPICS = ("import",)
CODE_MODULES = ("bisect", "colorsys")
# The gate's prose-and-code text is made of these; "execmodel" holds "naming" and "exceptions".
GATE_TOPICS = ("exceptions", "execmodel", "truth", "naming")
GATE_MODULES = ("textwrap", "shlex", "fnmatch")
CALIBRATION_MODULES = (
    "heapq",
    "queue",
    "string",
    "contextlib",
    "graphlib",
    "sched",
    "fractions",
    "statistics",
)
CALIBRATION_BYTES = 160_000  # ~40k tokens: 156 windows of 256 tokens
# Besides CPython: README prose and sources of packages that are not a source of any judging text
# (permissive licences: MIT, BSD, Apache-2.0, Unlicense): calibration-mixed asks whether a tuning on
# one source fits that source's style; measured (docs/quality.md), the extra sources did not help.
CALIBRATION_PROSE = (
    "tabulate", "email-validator", "regex", "sentencepiece", "annotated-types", "ruamel.yaml",
    "sympy", "accelerate", "pycparser", "charset-normalizer", "fsspec", "rich", "transformers",
    "pydantic", "typer", "urllib3", "click", "Jinja2", "python-dateutil", "pyparsing", "packaging",
)  # fmt: skip
CALIBRATION_CODE = (
    "click/core.py", "jinja2/lexer.py", "packaging/version.py", "tabulate/__init__.py",
    "rich/table.py", "fsspec/spec.py", "annotated_types/__init__.py", "charset_normalizer/api.py",
    "pyparsing/core.py", "dateutil/rrule.py", "urllib3/response.py", "typer/main.py",
    "markupsafe/__init__.py", "email_validator/syntax.py",
)  # fmt: skip
SECTION_BYTES = 3_000  # the grain of the interleaving: each 256-token window sees one or two kinds


def _reflow(topic: str) -> str:
    """A topic as paragraphs of one line each (the manual wraps them at 70 columns)."""
    paragraphs = [" ".join(p.split()) for p in topic.split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


def _module(name: str) -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / f"{name}.py").read_text(encoding="utf-8")


def paragraphs(text: str) -> set[str]:
    """Paragraphs long enough to be distinctive, whitespace-normalised."""
    return {" ".join(p.split()) for p in text.split("\n\n") if len(p) >= 80}


def disjoint(calibration: str, held_out: list[str]) -> list[str]:
    """Paragraphs of the held-out texts that also appear in the calibration text."""
    flat = " ".join(calibration.split())
    return [p[:60] for text in held_out for p in paragraphs(text) if p in flat]


def _sections(text: str, size: int = SECTION_BYTES) -> list[str]:
    """``text`` in pieces of about ``size`` characters, cut at blank lines."""
    out, current = [], ""
    for para in text.split("\n\n"):
        current = f"{current}\n\n{para}" if current else para
        if len(current) >= size:
            out.append(current)
            current = ""
    return out + ([current] if current else [])


def _package_code(relative: str) -> str:
    """The middle third of a package's source file (its start is licence text and imports)."""
    text = (Path(sysconfig.get_paths()["purelib"]) / relative).read_text(encoding="utf-8")
    third = len(text) // 3
    start = text.index("\n\n", third) + 2
    return text[start : text.rindex("\n\n", 0, 2 * third)]


def _interleave(kinds: list[list[str]]) -> str:
    """One section of each kind in turn, to ``CALIBRATION_BYTES`` characters."""
    out = ""
    for i in range(max(map(len, kinds))):
        for sections in kinds:
            if i < len(sections) and len(out) < CALIBRATION_BYTES:
                out += sections[i][: CALIBRATION_BYTES - len(out)] + "\n\n"
    return out


def build() -> dict[str, str]:
    from pydoc_data.topics import topics

    prose = "\n\n".join(_reflow(topics[t]) for t in PROSE_TOPICS)
    code = "\n\n".join(_module(m) for m in CODE_MODULES)
    excluded = set(PROSE_TOPICS) | set(GATE_TOPICS)
    prose_parts = [_reflow(topics[t]) for t in sorted(topics) if t not in excluded]
    code_parts = [_module(m) for m in CALIBRATION_MODULES]
    readmes = (p for pkg in CALIBRATION_PROSE for p in _readme_prose(pkg) if "License" not in p)
    mixed = [
        _sections("\n\n".join(prose_parts)),
        _sections("\n\n".join(code_parts)),
        _sections("\n\n".join(readmes)),
        [s for f in CALIBRATION_CODE for s in _sections(_package_code(f))],
    ]
    return {
        "prose": prose,
        "code": code,
        "calibration": _interleave([prose_parts, code_parts]),
        "calibration-mixed": _interleave(mixed),
    }


# Judging texts from sources no calibration text comes from (PyPI packages' READMEs and sources,
# permissive licences): the figures a user reads measure generalisation, not fit to CPython's
# docs and stdlib, which every code model has trained on.
OTHER_PROSE = ("threadpoolctl", "h11", "sortedcontainers", "attrs", "idna", "psutil")  # BSD/MIT/Apache
OTHER_CODE = ("h11/_connection.py", "sortedcontainers/sorteddict.py")  # MIT, Apache-2.0
OTHER_BYTES = 12_000  # ~2,500 tokens of each kind: over 1,024 scored tokens on any tokenizer


def _readme_prose(package: str) -> list[str]:
    """English paragraphs of an installed package's README (its METADATA body): no code, lists,
    tables or headings, re-flowed to one line each."""
    from importlib import metadata

    body = metadata.metadata(package).get_payload()  # type: ignore[attr-defined]
    out = []
    for block in str(body).split("\n\n"):
        lines = block.splitlines()
        if not lines or any(
            ln.startswith((" ", "\t", ">", "|", "#", "*", "-", "`", "=", ".. ", "[", "<")) for ln in lines
        ):
            continue
        text = " ".join(block.split())
        letters = sum(c.isalpha() or c == " " for c in text)
        if len(text) >= 150 and letters / len(text) > 0.85 and "http" not in text:
            out.append(text)
    return out


def other_sources() -> dict[str, str]:
    site = Path(sysconfig.get_paths()["purelib"])
    prose = "\n\n".join(p for pkg in OTHER_PROSE for p in _readme_prose(pkg))[:OTHER_BYTES]
    share = OTHER_BYTES // len(OTHER_CODE)  # an equal part of each file, cut at a blank line
    parts = [(site / f).read_text(encoding="utf-8")[:share].rsplit("\n\n", 1)[0] for f in OTHER_CODE]
    return {"other-prose": prose.rsplit("\n\n", 1)[0], "other-code": "\n\n".join(parts)}


# Selection texts: a third set of sources, neither calibration nor judging text. The build may
# choose between quantized models by their score on these (``quantization.gptq.escalate``); the
# judging texts must stay out of every choice, or the figure a user reads measures a fit to them.
SELECT_README = (
    "tqdm", "requests", "platformdirs", "tomlkit", "anyio", "joblib", "cattrs", "narwhals",
    "dnspython", "omegaconf", "Pygments", "scikit-learn", "pandas",
)  # fmt: skip
# English paragraphs of docstrings (no parameter lists, code or markup): BSD
SELECT_DOCSTRINGS = (
    "sklearn/model_selection/_split.py", "sklearn/ensemble/_forest.py", "joblib/parallel.py",
    "sklearn/linear_model/_ridge.py", "sklearn/decomposition/_pca.py",
)  # fmt: skip
SELECT_CODE = ("tomlkit/parser.py", "pluggy/_manager.py", "joblib/memory.py")  # MIT, MIT, BSD


MARKUP = (">", "|", "#", "*", "-", "`", "=", ".. ", "[", "<")  # a line that starts a list, table or code


def _docstring_prose(relative: str) -> list[str]:
    """Paragraphs of a source file's docstrings that read as English prose, re-flowed."""
    import ast

    tree = ast.parse((Path(sysconfig.get_paths()["purelib"]) / relative).read_text(encoding="utf-8"))
    out = []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        doc = ast.get_docstring(node) if isinstance(node, kinds) else None
        for block in (doc or "").split("\n\n"):
            lines = block.strip().splitlines()
            if not lines or " : " in lines[0] or lines[0].rstrip().endswith(":"):
                continue  # a parameter's entry or a section heading
            if any(ln.lstrip().startswith(MARKUP) for ln in lines):
                continue
            text = " ".join(block.split())
            letters = sum(c.isalpha() or c == " " for c in text)
            if len(text) >= 150 and letters / len(text) > 0.9 and "http" not in text and "_" not in text:
                out.append(text)
    return out


def selection_sources() -> dict[str, str]:
    readmes = [p for pkg in SELECT_README for p in _readme_prose(pkg)]
    docs = [p for f in SELECT_DOCSTRINGS for p in _docstring_prose(f)]
    mixed = [p for pair in zip(readmes, docs, strict=False) for p in pair]
    mixed += readmes[len(docs) :] + docs[len(readmes) :]
    prose = "\n\n".join(mixed)[:OTHER_BYTES]
    share = OTHER_BYTES // len(SELECT_CODE)  # from each file's middle third: its start is imports
    parts = [_package_code(f)[:share].rsplit("\n\n", 1)[0] for f in SELECT_CODE]
    return {"select-prose": prose.rsplit("\n\n", 1)[0], "select-code": "\n\n".join(parts)}


def main() -> None:
    texts = {**build(), **other_sources(), **selection_sources()}
    gate = (TEXTS / "prose-and-code.txt").read_text(encoding="utf-8")
    held_out = [texts["prose"], texts["code"], texts["other-prose"], texts["other-code"], gate]
    held_out += [texts["select-prose"], texts["select-code"]]
    for name in TRAINING_TEXTS:
        shared = disjoint(texts[name], held_out)
        if shared:
            raise SystemExit(f"{name} text shares paragraphs with held-out text: {shared}")
    for name, text in texts.items():
        (TEXTS / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"{name}.txt: {len(text)} characters")


if __name__ == "__main__":
    main()
