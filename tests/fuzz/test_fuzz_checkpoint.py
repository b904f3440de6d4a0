"""Fuzzed checkpoint folders: config.json, model.safetensors.index.json and the safetensors headers
reach ``open_checkpoint`` / ``load_model`` / ``check_finite``; each case changes one thing of the
shipped checkpoint and gets a checkpoint that makes sense or a one-line CheckpointError."""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from hypothesis import strategies as st

from exporter.build.pipeline import DEFAULT_CHECKPOINT
from exporter.errors import CheckpointError
from exporter.model.checkpoint import Checkpoint, check_finite, load_model, open_checkpoint
from tests.fuzz.harness import JSON_VALUES, deep_json, expect_clean, fuzz, json_text

CONFIG = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text(encoding="utf-8"))
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
WEIGHTS = (DEFAULT_CHECKPOINT / "model.safetensors").read_bytes()
(HEADER_SIZE,) = struct.unpack("<Q", WEIGHTS[:8])
HEADER = json.loads(WEIGHTS[8 : 8 + HEADER_SIZE])
TENSORS = sorted(k for k in HEADER if k != "__metadata__")

# numbers a config could hold that no model has
BAD_NUMBERS = st.sampled_from([0, -1, -4096, 2**31, 2**63, 10**40, 0.5, 1e308, math.nan, math.inf, -math.inf])
CONFIG_KEYS = sorted(
    {*CONFIG, "head_dim", "rope_scaling", "rope_theta", "sliding_window", "use_sliding_window"}
)


@contextmanager
def checkpoint_folder(**files: str | bytes) -> Iterator[Path]:
    """A fresh copy of the shipped checkpoint (weights hard-linked) with ``files`` written over it."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        folder.mkdir()
        written = {name.replace("__", "."): content for name, content in files.items()}
        for src in DEFAULT_CHECKPOINT.iterdir():
            if src.name not in written:
                os.link(src, folder / src.name)
        for name, content in written.items():
            path = folder / name
            # never write through a hard link: that would change the shipped checkpoint itself
            path.unlink(missing_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        yield folder


def assert_sane(ckpt: Checkpoint) -> None:
    """What an opened checkpoint promises the build: sizes a model can have, finite positive floats."""
    a = ckpt.args
    sizes = [a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim, a.hidden_dim, a.vocab_size]
    assert all(type(n) is int and n > 0 for n in [*sizes, a.max_position_embeddings]), a
    assert a.n_heads % a.n_kv_heads == 0, a
    floats = [a.norm_eps, a.rope_theta]
    if a.rope_scaling is not None:
        s = a.rope_scaling
        floats += [s.factor, s.low_freq_factor, s.high_freq_factor]
        assert s.original_max_position_embeddings > 0, s
    assert all(math.isfinite(x) and x > 0 for x in floats), a


def open_and_load(folder: Path, finite: bool = True) -> None:
    """open_checkpoint, and for a checkpoint small enough to build here, load_model (and check_finite,
    unless the case changed nothing it reads)."""
    ckpt = expect_clean(lambda: open_checkpoint(folder))
    if isinstance(ckpt, CheckpointError):
        return
    assert_sane(ckpt)
    if ckpt.args.n_layers <= 8 and ckpt.args.parameter_count() <= 50_000_000:
        # bf16 as stored: a conversion would only add time per case
        seq = min(16, ckpt.args.max_position_embeddings)
        expect_clean(lambda: load_model(ckpt, max_seq_len=seq, dtype=torch.bfloat16))
        if finite:
            expect_clean(lambda: check_finite(ckpt))


def _config_with(key: str, action: str, value: Any) -> str:
    config = dict(CONFIG)
    if action == "delete":
        config.pop(key, None)
    elif action == "rope":  # one field of a Llama-3 rope scaling
        config["rope_parameters"] = {**LLAMA3_ROPE, key: value}
    else:
        config[key] = value
    return json_text(config)


def test_config_json_with_one_key_changed() -> None:
    values = JSON_VALUES | BAD_NUMBERS
    keys = st.sampled_from(CONFIG_KEYS)
    cases = st.builds(_config_with, keys, st.sampled_from(["set", "set", "delete"]), values) | st.builds(
        _config_with, st.sampled_from(sorted(LLAMA3_ROPE)), st.just("rope"), values
    )

    def check(config: str) -> None:
        with checkpoint_folder(config__json=config) as folder:
            open_and_load(folder, finite=False)

    fuzz("checkpoint: config.json with one key changed", 300, cases, check)


def test_config_json_of_arbitrary_content() -> None:
    content = (
        st.builds(json_text, JSON_VALUES)
        | st.binary()
        | st.text()
        | st.sampled_from([deep_json(100_000), "1" * 5000, '{"hidden_size": ' + "9" * 5000 + "}"])
    )

    def check(config: str | bytes) -> None:
        with checkpoint_folder(config__json=config) as folder:
            open_and_load(folder, finite=False)

    fuzz("checkpoint: config.json of arbitrary content", 300, content, check)


SHARD_NAMES = st.sampled_from(
    [
        "model.safetensors",
        "missing.safetensors",
        "../model.safetensors",
        "../../etc/passwd",
        "/etc/passwd",
        str(DEFAULT_CHECKPOINT / "model.safetensors"),
        "sub/../model.safetensors",
        "./model.safetensors",
        "",
        ".",
        "..",
        "tokenizer.json",
        "config.json",
    ]
) | st.text(max_size=12)


def test_safetensors_index() -> None:
    weight_maps = (
        st.dictionaries(st.sampled_from(TENSORS) | st.text(max_size=8), SHARD_NAMES, max_size=4)
        | JSON_VALUES
        | st.builds(lambda name: dict.fromkeys(TENSORS, name), SHARD_NAMES)
    )
    index = (
        st.builds(lambda m: json_text({"metadata": {}, "weight_map": m}), weight_maps)
        | st.builds(json_text, JSON_VALUES)
        | st.binary(max_size=64)
    )

    def check(text: str | bytes) -> None:
        with checkpoint_folder(model__safetensors__index__json=text) as folder:
            ckpt = expect_clean(lambda: open_checkpoint(folder))
            if isinstance(ckpt, Checkpoint):  # every shard it names lies inside the folder
                assert all(f.parent == folder and f.is_file() for f in ckpt.weight_files), ckpt.weight_files
                open_and_load(folder)

    fuzz("checkpoint: model.safetensors.index.json", 300, index, check)


def _with_header(header: Any, size: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if size is None else size) + raw + WEIGHTS[8 + HEADER_SIZE :]


def _entry_changed(name: str, field: str, value: Any) -> bytes:
    header = json.loads(json.dumps(HEADER))
    if field == "whole":
        header[name] = value
    else:
        header[name][field] = value
    return _with_header(header)


# Named builders, not lambdas: Hypothesis shows a failing case as the call that built it, and the
# repr of megabytes of weights would cost more than the case itself.
def _metadata(value: Any) -> bytes:
    return _with_header({**HEADER, "__metadata__": value})


def _header_size(size: int) -> bytes:
    return _with_header(HEADER, size)


def _truncated(size: int) -> bytes:
    return WEIGHTS[:size]


def _flipped(at: int, byte: int) -> bytes:
    data = bytearray(WEIGHTS)
    data[at % (8 + HEADER_SIZE)] = byte
    return bytes(data)


def test_corrupt_safetensors_headers() -> None:
    ints = st.integers() | BAD_NUMBERS
    fields = st.sampled_from(["dtype", "shape", "data_offsets", "whole"])
    values = (
        JSON_VALUES
        | st.sampled_from(["F32", "F16", "BF16", "I8", "U8", "F64", "BOOL", "F8_E4M3", "Q4"])
        | st.lists(ints, max_size=3)
    )
    weights = (
        st.builds(_entry_changed, st.sampled_from(TENSORS), fields, values)
        | st.builds(_metadata, JSON_VALUES)
        | st.builds(_with_header, JSON_VALUES)
        | st.builds(_header_size, st.integers(0, 2**64 - 1))
        | st.builds(_flipped, st.integers(0, 10**6), st.integers(0, 255))
        | st.builds(_truncated, st.integers(0, len(WEIGHTS) - 1))
    )

    def check(data: bytes) -> None:
        with checkpoint_folder(model__safetensors=data) as folder:
            open_and_load(folder)

    fuzz("checkpoint: corrupt safetensors headers", 150, weights, check)
