"""Recipes: one TOML file per device target, loaded into frozen dataclasses.

Unknown keys, wrong types and impossible values are ``RecipeError``s that name the file and the
dotted key. Checks that need the model's shapes (``check_fits``) run right after config.json is read,
before any weight is loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import RecipeError
from .model import ModelArgs

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
BACKENDS = ("xnnpack", "aoti")
# 8da4w: int8 dynamic activations + int4 weights (XNNPACK). int4_weight_only: bf16 activations,
# int4 weights packed for ATen's CPU tinygemm kernel (AOTInductor on x86 servers).
LINEAR_SCHEMES = ("8da4w", "int4_weight_only")
SCALE_ALGORITHMS = {"8da4w": ("affine", "hqq_scale_only"), "int4_weight_only": ("affine", "hqq")}
DTYPES = ("float32", "bfloat16")


class _Invalid(ValueError):
    """Raised from ``__post_init__`` to say which key of the section is wrong."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _one_of(key: str, value: object, allowed: tuple[object, ...]) -> None:
    if value not in allowed:
        raise _Invalid(key, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise _Invalid(key, f"must be > 0, got {value!r}")


@dataclass(frozen=True)
class ExportSettings:
    max_seq_len: int = 512
    dtype: str = "float32"
    custom_sdpa: bool = True  # ExecuTorch's llama::custom_sdpa + update_cache (XNNPACK only)

    def __post_init__(self) -> None:
        _positive("max_seq_len", self.max_seq_len)
        _one_of("dtype", self.dtype, DTYPES)


@dataclass(frozen=True)
class LinearQuant:
    scheme: str = "8da4w"  # int8 dynamic activations + int4 groupwise weights
    group_size: int = 32
    scale_algorithm: str = "affine"

    def __post_init__(self) -> None:
        _one_of("scheme", self.scheme, LINEAR_SCHEMES)
        _positive("group_size", self.group_size)
        _one_of("scale_algorithm", self.scale_algorithm, SCALE_ALGORITHMS[self.scheme])


@dataclass(frozen=True)
class EmbeddingQuant:
    bits: int = 4
    group_size: int = 32

    def __post_init__(self) -> None:
        _one_of("bits", self.bits, (4, 8))
        _positive("group_size", self.group_size)


@dataclass(frozen=True)
class Quantization:
    linear: LinearQuant | None = None
    embedding: EmbeddingQuant | None = None


@dataclass(frozen=True)
class ValidationSettings:
    """The gate. Every tolerance is relative to the model (logit spread, KL, perplexity ratio), so
    one recipe means the same on a 4M-parameter code model and a pretrained instruct model."""

    # Raw-text prompts, continued greedily by the artifact and compared with eager.
    prompts: tuple[str, ...] = ("def main(",)
    # User messages rendered with the checkpoint's chat template (checkpoints without one skip them).
    chat_prompts: tuple[str, ...] = ()
    greedy_steps: int = 32
    # A greedy mismatch is excused only where eager's own top-2 logit margin is below this: there
    # eager itself has no clear favourite. Independent of the artifact's measured error.
    tie_margin: float = 0.05
    # artifact vs the eager model it was exported from (same quantization): the largest logit error
    # over eager's logit spread (standard deviation over the vocabulary) at that position, and the
    # mean KL(eager || artifact) per token, on the greedy runs and the held-out text
    max_logit_error: float = 1e-4
    max_kl_vs_eager: float = 1e-6
    # artifact vs eager fp32, teacher-forced on held-out text
    # a shipped text's name or a file path; "" = the checkpoint's heldout.txt, else "prose-and-code"
    text: str = ""
    eval_tokens: int = 256
    # top-1 agreement is counted where fp32's own top-2 logit margin is at least this
    clear_margin: float = 1.0
    min_top1_agreement: float = 0.99
    max_perplexity_ratio: float = 1.01

    def __post_init__(self) -> None:
        if not self.prompts or any(not p for p in self.prompts):
            raise _Invalid("prompts", "must list at least one non-empty prompt")
        if any(not p for p in self.chat_prompts):
            raise _Invalid("chat_prompts", "must not hold an empty message")
        if self.greedy_steps < 32:
            raise _Invalid("greedy_steps", f"must be >= 32, got {self.greedy_steps}")
        if not 0 <= self.tie_margin <= 1:
            raise _Invalid("tie_margin", f"must be in [0, 1] (a logit margin), got {self.tie_margin}")
        _positive("max_logit_error", self.max_logit_error)
        _positive("max_kl_vs_eager", self.max_kl_vs_eager)
        _positive("eval_tokens", self.eval_tokens)
        if self.clear_margin < 0:
            raise _Invalid("clear_margin", f"must be >= 0, got {self.clear_margin}")
        if not 0 < self.min_top1_agreement <= 1:
            raise _Invalid("min_top1_agreement", f"must be in (0, 1], got {self.min_top1_agreement}")
        if self.max_perplexity_ratio < 1:
            raise _Invalid("max_perplexity_ratio", f"must be >= 1, got {self.max_perplexity_ratio}")


@dataclass(frozen=True)
class Recipe:
    name: str
    backend: Literal["xnnpack", "aoti"]
    description: str = ""
    export: ExportSettings = field(default_factory=ExportSettings)
    quantization: Quantization = field(default_factory=Quantization)
    validation: ValidationSettings = field(default_factory=ValidationSettings)

    def __post_init__(self) -> None:
        _one_of("backend", self.backend, BACKENDS)
        if self.backend == "aoti" and self.export.custom_sdpa:
            raise _Invalid("export.custom_sdpa", "is an ExecuTorch op; set it false for aoti")
        linear = self.quantization.linear
        if linear is not None:
            wanted = {"8da4w": "xnnpack", "int4_weight_only": "aoti"}[linear.scheme]
            if self.backend != wanted:
                raise _Invalid("quantization.linear.scheme", f"{linear.scheme!r} needs backend {wanted!r}")
            if linear.scheme == "int4_weight_only" and self.export.dtype != "bfloat16":
                raise _Invalid("export.dtype", "int4_weight_only runs bf16 activations; set 'bfloat16'")
        if self.backend == "aoti" and self.quantization.embedding is not None:
            raise _Invalid("quantization.embedding", "no packed low-bit embedding kernel under aoti")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def recipe_path(name_or_path: str) -> Path:
    """A recipe name (file in recipes/) or a path to a TOML file."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        return path
    return RECIPES_DIR / f"{name_or_path}.toml"


def list_recipes() -> list[Path]:
    return sorted(RECIPES_DIR.glob("*.toml"))


def load_recipe(name_or_path: str, overrides: tuple[str, ...] = ()) -> Recipe:
    path = recipe_path(name_or_path)
    if not path.is_file():
        known = ", ".join(p.stem for p in list_recipes())
        raise RecipeError(path, f"recipe not found (shipped recipes: {known})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise RecipeError(path, f"not valid TOML ({e})") from e
    for item in overrides:
        _apply_override(path, data, item)
    return _build(Recipe, data, path, "")


def recipe_from_dict(data: dict[str, Any], source: Path) -> Recipe:
    """A resolved recipe as stored in a manifest, checked like a file."""
    return _build(Recipe, data, source, "")  # type: ignore[no-any-return]


def _apply_override(path: Path, data: dict[str, Any], item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise RecipeError(path, f"--set {item!r}: expected key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string: --set backend=aoti
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise RecipeError(path, f"--set {key}: {part!r} is not a table")
    node[leaf] = value


def _build(cls: type, data: Any, path: Path, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise RecipeError(path, f"{prefix.rstrip('.') or 'recipe'}: expected a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise RecipeError(path, f"unknown key '{prefix}{unknown[0]}' (known: {', '.join(sorted(names))})")
    kwargs = {k: _convert(hints[k], v, path, f"{prefix}{k}") for k, v in data.items()}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise RecipeError(path, f"required key {prefix}{missing[0]} missing")
    try:
        return cls(**kwargs)
    except _Invalid as e:
        raise RecipeError(path, f"{prefix}{e.key}: {e}") from e


def _convert(hint: Any, value: Any, path: Path, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):  # `X | None`: absent, or None in a manifest
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _convert(inner, value, path, key)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, key + ".")  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RecipeError(path, f"{key}: expected a list of strings, got {value!r}")
        return tuple(value)
    if origin is Literal:
        hint = str
    expected = {int: (int,), float: (float, int), str: (str,), bool: (bool,)}[hint]
    if not isinstance(value, expected) or (hint is not bool and isinstance(value, bool)):
        raise RecipeError(path, f"{key}: expected {hint.__name__}, got {value!r}")
    if hint is float and not math.isfinite(float(value)):
        raise RecipeError(path, f"{key}: expected a finite number, got {value!r}")
    return float(value) if hint is float else value


def check_fits(recipe: Recipe, args: ModelArgs, path: Path) -> None:
    """Checks that need the model's shapes; cheap, so they run before any weights are read."""
    linear = recipe.quantization.linear
    if linear is not None:
        in_features = {
            "attention q/k/v and feed-forward gate/up (hidden_size)": args.dim,
            "attention output (n_heads * head_dim)": args.n_heads * args.head_dim,
            "feed-forward down (intermediate_size)": args.hidden_dim,
        }
        for what, size in in_features.items():
            if size % linear.group_size:
                raise RecipeError(
                    path,
                    f"quantization.linear.group_size: {linear.group_size} does not divide the "
                    f"input size {size} of the {what} layers",
                )
    emb = recipe.quantization.embedding
    if emb is not None and args.dim % emb.group_size:
        raise RecipeError(
            path,
            f"quantization.embedding.group_size: {emb.group_size} does not divide the embedding "
            f"dimension {args.dim}",
        )
    if recipe.export.max_seq_len > args.max_position_embeddings:
        raise RecipeError(
            path,
            f"export.max_seq_len: {recipe.export.max_seq_len} exceeds the model's "
            f"max_position_embeddings {args.max_position_embeddings}",
        )
