"""Fuzzed tokenizer files: tokenizer.json, tokenizer_config.json, special_tokens_map.json,
generation_config.json, chat_template.jinja and config.json's token ids, as ``load_tokenizer`` and
``tokenizer_info`` read them; each case changes one thing of the shipped checkpoint's files and gets
tokenizer facts or a one-line CheckpointError."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from exporter.build.pipeline import DEFAULT_CHECKPOINT
from exporter.errors import CheckpointError
from exporter.model.tokenizer import TokenizerInfo, encode, load_tokenizer, tokenizer_info
from tests.fuzz.harness import JSON_VALUES, deep_json, expect_clean, fuzz, json_text

FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
SHIPPED = {name: json.loads((DEFAULT_CHECKPOINT / name).read_text(encoding="utf-8")) for name in FILES}
CONFIG = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text(encoding="utf-8"))
VOCAB = len(SHIPPED["tokenizer.json"]["model"]["vocab"])

TOKEN_IDS = st.integers(-2, VOCAB + 2) | st.sampled_from([2**31, 2**63, -(2**63)])
TOKEN_TEXTS = st.sampled_from(["<|bos|>", "<|endoftext|>", "def", "", "<unk>"]) | st.text(max_size=8)
# values special tokens and ids take in these files, besides arbitrary JSON
TOKEN_VALUES = (
    JSON_VALUES
    | TOKEN_IDS
    | st.lists(TOKEN_IDS, max_size=3)
    | TOKEN_TEXTS
    | st.builds(lambda t: {"content": t}, TOKEN_TEXTS | JSON_VALUES)
)


def _template(ids: list[Any], token: str) -> dict[str, Any]:
    """A post-processor that puts ``token`` (with ``ids``) in front of each text."""
    special = {"SpecialToken": {"id": token, "type_id": 0}}
    sequence = {"Sequence": {"id": "A", "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [special, sequence],
        "pair": [special, sequence, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {token: {"id": token, "ids": ids, "tokens": [token] * len(ids)}},
    }


def _changed(file: str, key: str, value: Any) -> tuple[str, str]:
    data = dict(SHIPPED[file])
    if value is ...:
        data.pop(key, None)
    else:
        data[key] = value
    return file, json_text(data)


def describe(files: dict[str, str | bytes], config: dict[str, Any]) -> None:
    """Write the files over a copy of the shipped tokenizer files, then read them as a build does."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in FILES:
            (folder / name).write_bytes((DEFAULT_CHECKPOINT / name).read_bytes())
        for name, content in files.items():
            (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        tokenizer = expect_clean(lambda: load_tokenizer(folder / "tokenizer.json"))
        if isinstance(tokenizer, CheckpointError):
            return
        info = expect_clean(lambda: tokenizer_info(folder, config, tokenizer))
        if isinstance(info, TokenizerInfo):
            assert min(info.eos_ids) >= 0 and max(info.eos_ids) < info.vocab_size
            assert info.bos_id is None or 0 <= info.bos_id < info.vocab_size
            assert TokenizerInfo.from_dict(info.path, json.loads(json.dumps(info.to_dict()))) == info
            assert encode(tokenizer, info, "def main(")  # the text's own ids at least


def _check_file(case: tuple[str, str | bytes]) -> None:
    describe({case[0]: case[1]}, CONFIG)


def test_tokenizer_config_and_generation_config() -> None:
    keys = {
        "tokenizer_config.json": [
            *("bos_token", "eos_token", "unk_token", "pad_token", "chat_template"),
            *("added_tokens_decoder", "add_bos_token"),
        ],
        "generation_config.json": ["bos_token_id", "eos_token_id", "temperature", "top_k", "do_sample"],
    }
    one_key = st.one_of(
        st.builds(_changed, st.just(file), st.sampled_from(names), TOKEN_VALUES | st.just(...))
        for file, names in keys.items()
    )
    templates = st.lists(
        st.fixed_dictionaries({"name": TOKEN_TEXTS | JSON_VALUES, "template": st.text() | JSON_VALUES}),
        max_size=3,
    )
    cases = (
        one_key
        | st.builds(_changed, st.just("tokenizer_config.json"), st.just("chat_template"), templates)
        | st.tuples(st.sampled_from(FILES[1:]), st.builds(json_text, JSON_VALUES) | st.binary())
        | st.tuples(st.sampled_from(FILES[1:]), st.sampled_from([deep_json(100_000), "[" + "9" * 5000 + "]"]))
    )
    fuzz("tokenizer: tokenizer_config.json and generation_config.json", 300, cases, _check_file)


def test_special_tokens_map_and_chat_template_files() -> None:
    names = st.sampled_from(["bos_token", "eos_token", "unk_token", "pad_token"])
    cases = st.tuples(
        st.just("special_tokens_map.json"),
        st.builds(json_text, st.dictionaries(names, TOKEN_VALUES, max_size=3) | JSON_VALUES) | st.binary(),
    ) | st.tuples(st.just("chat_template.jinja"), st.text() | st.binary())
    fuzz("tokenizer: special_tokens_map.json and chat_template.jinja", 200, cases, _check_file)


def test_token_ids_in_config_json() -> None:
    ids = st.fixed_dictionaries({}, optional={"bos_token_id": TOKEN_VALUES, "eos_token_id": TOKEN_VALUES})

    def check(changes: dict[str, Any]) -> None:
        config = {k: v for k, v in CONFIG.items() if k not in ("bos_token_id", "eos_token_id")}
        describe({}, {**config, **changes})

    fuzz("tokenizer: token ids in config.json", 200, ids, check)


def test_tokenizer_json() -> None:
    keys = st.sampled_from(
        [
            *("truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor"),
            *("decoder", "model", "version"),
        ]
    )
    post_processors = st.builds(_template, st.lists(TOKEN_IDS, max_size=3), TOKEN_TEXTS)
    cases = (
        st.builds(_changed, st.just("tokenizer.json"), keys, JSON_VALUES | st.just(...))
        | st.builds(_changed, st.just("tokenizer.json"), st.just("post_processor"), post_processors)
        | st.tuples(st.just("tokenizer.json"), st.builds(json_text, JSON_VALUES) | st.binary())
        | st.tuples(st.just("tokenizer.json"), st.sampled_from([deep_json(100_000), "[" + "9" * 5000 + "]"]))
    )
    fuzz("tokenizer: tokenizer.json", 200, cases, _check_file)
