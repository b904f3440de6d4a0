"""Fuzzed recipes: TOML files and ``--set key=value`` overrides reach ``load_recipe``; every input
loads or is a one-line RecipeError."""

from __future__ import annotations

import dataclasses
import datetime
import json
import tempfile
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from exporter.errors import RecipeError
from exporter.recipe import Recipe, list_recipes, load_recipe
from tests.fuzz.harness import expect_clean, fuzz

SHIPPED = {p.stem: tomllib.loads(p.read_text(encoding="utf-8")) for p in list_recipes()}


def _keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key a recipe has, tables included (``quantization.linear``, ``...group_size``);
    ``.0.`` stands for the first table of a list of tables (``quantization.mixed.candidates.0.scheme``)."""
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        out.append(key)
        hint = typing.get_type_hints(cls)[f.name]
        inner = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
        if dataclasses.is_dataclass(hint):
            out += _keys(hint, key + ".")  # type: ignore[arg-type]
        elif inner:
            listed = typing.get_origin(hint) is tuple
            out += _keys(inner[0], key + (".0." if listed else "."))  # type: ignore[arg-type]
    return out


KEYS = _keys(Recipe)

# TOML values (TOML has no null), as tomllib returns them
TOML_SCALARS = (
    st.booleans()
    | st.integers()
    | st.sampled_from([0, -1, 1, 31, 33, 2**63 - 1, -(2**63)])
    | st.floats()
    | st.text(max_size=20)
    | st.datetimes()
    | st.dates()
)
TOML_VALUES: st.SearchStrategy[Any] = st.recursive(
    TOML_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def toml_value(v: Any) -> str:
    """One value as TOML source (inline tables for tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | datetime.date):
        return v.isoformat() if isinstance(v, datetime.date) else str(v)
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, str):
        return json.dumps(v)  # JSON's escapes are all valid in a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(map(toml_value, v)) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_document(data: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items())


def _mutated(base: dict[str, Any], key: str, action: str, value: Any) -> dict[str, Any]:
    """The shipped recipe with one key set to ``value``, deleted, or an unknown key added beside it."""
    data = json.loads(json.dumps(base, default=str))  # a deep copy
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        # in a list of tables, change the first
        node = (node[0] if node else {}) if isinstance(node, list) else node.setdefault(part, {})
    if action == "delete":
        node.pop(leaf, None)
    elif action == "unknown":
        node[f"{leaf}_typo"] = value
    else:
        node[leaf] = value
    return data


def _load_file(content: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzzed.toml"
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        result = expect_clean(lambda: load_recipe(str(path)))
        assert isinstance(result, Recipe | RecipeError)


MUTATIONS = st.tuples(
    st.sampled_from(sorted(SHIPPED)),
    st.sampled_from(KEYS),
    st.sampled_from(["set", "set", "delete", "unknown"]),
    TOML_VALUES,
)


def test_recipe_files_with_one_key_changed() -> None:
    def check(case: tuple[str, str, str, Any]) -> None:
        name, key, action, value = case
        _load_file(toml_document(_mutated(SHIPPED[name], key, action, value)))

    fuzz("recipe: TOML with one key changed", 1000, MUTATIONS, check)


def test_recipe_files_of_arbitrary_text_and_bytes() -> None:
    content = (
        st.text()
        | st.binary()
        | st.builds(toml_document, st.dictionaries(st.text(max_size=8), TOML_VALUES, max_size=6))
        | st.sampled_from(["v = " + "1" * 5000, "v = " + "[" * 5000 + "]" * 5000, "a" + ".a" * 5000 + " = 1"])
    )
    fuzz("recipe: arbitrary text and bytes", 400, content, _load_file)


@pytest.mark.parametrize("name", ["android-arm64", "server-x86-int4"])
def test_recipe_overrides(name: str) -> None:
    raw = st.text() | st.builds(toml_value, TOML_VALUES)
    item = (
        st.text()
        | st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), raw)
        | st.builds(lambda k, v: f"{k}.{v}=1", st.sampled_from(KEYS), st.text(max_size=5))
        | st.sampled_from(["export.max_seq_len=" + "9" * 5000, "export=" + "[" * 5000 + "]" * 5000])
    )

    def check(overrides: list[str]) -> None:
        result = expect_clean(lambda: load_recipe(name, tuple(overrides)))
        assert isinstance(result, Recipe | RecipeError)

    fuzz(f"recipe: --set overrides on {name}", 300, st.lists(item, min_size=1, max_size=3), check)


def test_recipe_names_and_paths() -> None:
    names = st.text() | st.builds(lambda s: s + ".toml", st.text()) | st.just("x" * 5000)

    def check(name: str) -> None:
        result = expect_clean(lambda: load_recipe(name))
        assert isinstance(result, Recipe | RecipeError)

    fuzz("recipe: names and paths", 200, names, check)
