"""Hugging Face checkpoint folder -> ``ModelArgs`` + weights. Key renames live here alone.

Weights are read with safetensors' memory-mapped ``safe_open``, one tensor at a time, straight into a
model built on the meta device: no pickle is ever loaded and no random full-size init happens.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ..errors import CheckpointError
from ..plumbing.hashing import sha256_file
from .families import BY_ARCHITECTURE, FAMILIES, ConfigReader, Family
from .families.base import LLAMA_LAYER_KEYS, TOP_KEYS
from .transformer import ModelArgs, Transformer

SUPPORTED_ARCHITECTURES = {arch: family.name for arch, family in BY_ARCHITECTURE.items()}
# Tensors some exporters write that carry no weights of ours (recomputed from the config).
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder, checked enough to know what it holds, with nothing heavy loaded yet."""

    path: Path
    name: str
    architecture: str
    args: ModelArgs
    config: dict[str, Any]
    weight_files: tuple[Path, ...]
    tokenizer_path: Path
    family: Family = FAMILIES["llama"]


def open_checkpoint(path: Path) -> Checkpoint:
    """Read and check config.json, locate weights and tokenizer. Cheap: no tensor data is read."""
    path = Path(path)
    if not _exists(path, folder=True):
        raise CheckpointError(path, "checkpoint folder not found")
    config = _read_config(path / "config.json")
    architecture = _architecture(path / "config.json", config)
    args = config_to_args(path / "config.json", config, SUPPORTED_ARCHITECTURES[architecture])
    tokenizer = path / "tokenizer.json"
    if not tokenizer.is_file():
        raise CheckpointError(tokenizer, "tokenizer file missing (a Hugging Face tokenizer.json is required)")
    family = BY_ARCHITECTURE[architecture]
    return Checkpoint(path, path.name, architecture, args, config, _weight_files(path), tokenizer, family)


def _exists(path: Path, folder: bool = False) -> bool:
    """``is_dir``/``is_file``, where a name the OS refuses (too long) is no such file, not an OSError."""
    try:
        return path.is_dir() if folder else path.is_file()
    except OSError:
        return False


def read_json(file: Path) -> Any:
    """A JSON file, any way it cannot be read a CheckpointError: besides JSONDecodeError, json raises
    a plain ValueError for integers past Python's digit limit and RecursionError for deep nesting."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise CheckpointError(file, f"cannot read ({e.strerror or e})") from e
    except RecursionError as e:
        raise CheckpointError(file, "not valid JSON (nested too deeply)") from e
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(file, f"not valid JSON ({e})") from e


def _read_config(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise CheckpointError(file, "config.json missing from the checkpoint folder")
    config = read_json(file)
    if not isinstance(config, dict):
        raise CheckpointError(file, "expected a JSON object")
    return config


def _architecture(file: Path, config: dict[str, Any]) -> str:
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or len(archs) != 1:
        raise CheckpointError(file, f"'architectures' must list one architecture, got {archs!r}")
    arch = archs[0]
    if not isinstance(arch, str) or arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise CheckpointError(file, f"unsupported architecture {arch!r} (supported: {supported})")
    return str(arch)


def config_to_args(file: Path, config: dict[str, Any], family: str) -> ModelArgs:
    """Map a Hugging Face config to ``ModelArgs`` with the family's reader; anything we would silently
    get wrong (an unsupported value, a field no reader knows) is an error naming the field."""
    reader = ConfigReader(file, config)
    args = FAMILIES[family].read(reader)
    reader.check_unknown(family)
    return args


def _weight_files(path: Path) -> tuple[Path, ...]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = tuple(path / name for name in _shard_names(index))
    else:
        files = tuple(sorted(path.glob("*.safetensors")))
    if not files:
        raise CheckpointError(
            path, "no *.safetensors weights found (pickled .bin checkpoints are not loaded)"
        )
    for file in files:
        if not _exists(file):
            raise CheckpointError(file, "weight shard listed in the index is missing")
    return files


def _shard_names(index: Path) -> list[str]:
    """The shard files an index's weight_map names: file names in the checkpoint folder, nothing that
    reaches outside it (``../x``, absolute paths)."""
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(
            index, "invalid safetensors index (weight_map must map tensor names to file names)"
        )
    names = sorted(set(weight_map.values()))
    for name in names:
        if Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(index, f"shard {name!r} is not a file name in the checkpoint folder")
    return names


def hf_to_ours(name: str, layer_keys: Mapping[str, str] = LLAMA_LAYER_KEYS) -> str | None:
    """Hugging Face tensor name -> our parameter name; None for names we do not know."""
    if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name):
        layer, module, kind = m.groups()
        ours = layer_keys.get(module)
        return None if ours is None else f"layers.{layer}.{ours}.{kind}"
    if m := re.fullmatch(r"(.+)\.(weight|bias)", name):
        ours = TOP_KEYS.get(m.group(1))
        return None if ours is None else f"{ours}.{m.group(2)}"
    return None


def load_model(ckpt: Checkpoint, max_seq_len: int, dtype: torch.dtype = torch.float32) -> Transformer:
    """Build the eager model and fill it from the checkpoint's safetensors, checking every tensor."""
    with torch.device("meta"):
        model = Transformer(ckpt.args, max_seq_len, cache_dtype=dtype)
    source = TensorSource(ckpt, model)
    model.load_state_dict(source.read(source.names(), dtype), strict=False, assign=True)
    if ckpt.args.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    model.init_buffers()
    return model.eval()


class TensorSource:
    """Where each of the model's tensors lies in the checkpoint, checked (names, shapes, nothing
    missing) from the safetensors headers alone; tensors are read on demand, a group at a time.

    Each ``read`` opens the files it needs and closes them again, so memory-mapped pages of
    tensors already consumed do not stay resident: a streamed build holds one layer, not the file.
    ``output.weight`` of a tied model resolves to the embedding's tensor."""

    def __init__(self, ckpt: Checkpoint, model: Transformer) -> None:
        expected = {k: v.shape for k, v in model.state_dict().items()}
        if ckpt.args.tie_word_embeddings:
            expected.pop("output.weight", None)
        self._family = ckpt.family
        self._where: dict[str, Location] = {}
        for file in ckpt.weight_files:
            self._where.update(_index_file(file, expected, ckpt.family))
        missing = sorted(set(expected) - set(self._where))
        if missing:
            names = ", ".join(_ours_to_hf(m, ckpt.family) for m in missing[:3])
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise CheckpointError(ckpt.weight_files[0], f"missing tensor {names}{more}")
        if ckpt.args.tie_word_embeddings:
            self._where["output.weight"] = self._where["tok_embeddings.weight"]

    def names(self, prefix: str = "") -> list[str]:
        """Our tensor names under ``prefix``; the tied head is left out of a whole-model listing."""
        names = [n for n in self._where if n.startswith(prefix)]
        tied = self._where.get("output.weight") == self._where.get("tok_embeddings.weight")
        return [n for n in names if not (tied and n == "output.weight" and prefix == "")]

    def read(self, names: list[str], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
        """``dtype`` None keeps each tensor as stored."""
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self._where[name][0], []).append(name)
        out: dict[str, torch.Tensor] = {}
        for file, ours in by_file.items():
            try:
                with safe_open(str(file), framework="pt") as f:
                    for name in ours:
                        _, stored, rows = self._where[name]
                        # each part of a fused tensor gets storage of its own: as views into one
                        # buffer, Phi-3's q/k/v and gate/up reached the .pte wrong (0.77 logits off
                        # eager; tests/build/test_families.py) though eager used them right
                        tensor = (
                            f.get_tensor(stored)
                            if rows is None
                            else f.get_slice(stored)[rows[0] : rows[1]].clone()
                        )
                        out[name] = self._as_ours(name, tensor, dtype)
            except (SafetensorError, OSError, RuntimeError) as e:
                raise CheckpointError(file, f"cannot read safetensors, truncated or corrupt? ({e})") from e
        return out

    def _as_ours(self, name: str, tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        offset = self._family.norm_offset
        if offset and self._family.is_norm(name):
            # (offset + w) in fp32, as the family's reference computes it; a norm weight is small
            tensor = tensor.float() + offset
        return tensor if dtype is None else tensor.to(dtype)


# Where one of our tensors lies: file, stored name, and the rows it takes of a fused tensor.
Location = tuple[Path, str, tuple[int, int] | None]


def _split_fused(
    file: Path, name: str, shape: list[int], expected: dict[str, torch.Size], family: Family
) -> dict[str, Location] | None:
    """A fused tensor (Phi-3's qkv_proj, gate_up_proj) as row ranges of our tensors, or None."""
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    if m is None or m.group(2) not in family.fused:
        return None
    layer, module, kind = m.groups()
    parts = [f"layers.{layer}.{ours}.{kind}" for ours in family.fused[module]]
    if any(p not in expected for p in parts):
        raise CheckpointError(file, f"unexpected tensor {name!r} for this architecture")
    rows = [expected[p][0] for p in parts]
    fused_shape = [sum(rows), *expected[parts[0]][1:]]
    if shape != fused_shape:
        raise CheckpointError(file, f"tensor {name!r} has shape {shape}, config.json implies {fused_shape}")
    starts = [sum(rows[:i]) for i in range(len(rows))]
    return {p: (file, name, (a, a + n)) for p, a, n in zip(parts, starts, rows, strict=True)}


def _index_file(file: Path, expected: dict[str, torch.Size], family: Family) -> dict[str, Location]:
    out: dict[str, Location] = {}
    try:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                split = _split_fused(file, name, list(f.get_slice(name).get_shape()), expected, family)
                if split is not None:
                    out.update(split)
                    continue
                ours = hf_to_ours(name, family.layer_keys)
                if ours is None or ours not in expected:
                    if _IGNORED.fullmatch(name) or (ours == "output.weight" and ours not in expected):
                        continue
                    raise CheckpointError(file, f"unexpected tensor {name!r} for this architecture")
                shape = list(f.get_slice(name).get_shape())
                if shape != list(expected[ours]):
                    raise CheckpointError(
                        file,
                        f"tensor {name!r} has shape {shape}, config.json implies {list(expected[ours])}",
                    )
                out[ours] = (file, name, None)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise CheckpointError(file, f"cannot read safetensors file, truncated or corrupt? ({e})") from e
    return out


def _ours_to_hf(name: str, family: Family) -> str:
    for hf in TOP_KEYS.items():
        if name.startswith(hf[1] + "."):
            return hf[0] + name[len(hf[1]) :]
    m = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", name)
    if m:
        inverse = {v: k for k, v in family.layer_keys.items()}
        inverse.update({ours: hf for hf, parts in family.fused.items() for ours in parts})
        return f"model.layers.{m.group(1)}.{inverse[m.group(2)]}.{m.group(3)}"
    return name


def check_finite(ckpt: Checkpoint) -> None:
    """Every floating-point tensor of the checkpoint is finite. A NaN or Inf weight would otherwise
    surface only at the end of the build, as a program that fails to load or a gate full of NaN;
    here it is one line naming the tensor, before any heavy work. One tensor at a time, checked a
    block of rows at a time, so the check holds no more than a block beyond the mapped file."""
    for file in ckpt.weight_files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    tensor = f.get_slice(name)
                    rows = tensor.get_shape()[0] if tensor.get_shape() else 1
                    for start in range(0, rows, 4096):
                        block = f.get_tensor(name) if rows == 1 else tensor[start : start + 4096]
                        if block.is_floating_point() and not bool(torch.isfinite(block).all()):
                            raise CheckpointError(file, f"tensor {name!r} holds NaN or Inf values")
        except (SafetensorError, OSError) as e:
            raise CheckpointError(file, f"cannot read safetensors file, truncated or corrupt? ({e})") from e


def digest_files(paths: list[Path]) -> str:
    """sha256 over the names and contents of files, in order; streams, so large shards are fine."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def fill(
    module: nn.Module, source: TensorSource, prefix: str, dtype: torch.dtype | None = torch.float32
) -> None:
    """Assign ``module``'s weights from the checkpoint tensors named ``prefix``* (None: as stored)."""
    tensors = source.read(source.names(prefix), dtype)
    module.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items()}, strict=False, assign=True)
