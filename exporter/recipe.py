"""Recipes: one TOML file per device target, loaded into frozen dataclasses.

Unknown keys, wrong types and impossible values are ``RecipeError``s that name the file and the
dotted key. Every stage reads its settings from here, so this module sits below them all and imports
nothing of the package but its errors. Checks that need the model's shapes
(``exporter.build.fits``) run right after config.json is read,
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

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
BACKENDS = ("xnnpack", "aoti")
# 8da4w: int8 dynamic activations + int4 groupwise weights (XNNPACK). 8da8w: int8 dynamic
# activations + int8 weights, one scale per output channel (XNNPACK). int4_weight_only: bf16
# activations, int4 weights packed for ATen's CPU tinygemm kernel (AOTInductor on x86 servers).
LINEAR_SCHEMES = ("8da4w", "8da8w", "int4_weight_only")
SCALE_ALGORITHMS = {
    "8da4w": ("affine", "hqq_scale_only"),
    "8da8w": ("affine",),
    "int4_weight_only": ("affine", "hqq"),
}
# Which backend runs each linear scheme.
SCHEME_BACKEND = {"8da4w": "xnnpack", "8da8w": "xnnpack", "int4_weight_only": "aoti"}
# Shipped texts that calibration and training may read (held out from every gate and evaluation).
TRAINING_TEXTS = ("calibration", "calibration-mixed")
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
    # XNNPACK's guarded shortcuts through ExecuTorch internals (backends/xnnpack/patches): the same
    # program in less time and memory; false runs the stock flow (EXPORTER_LEAN_LOWERING=0 too)
    lean_lowering: bool = True

    def __post_init__(self) -> None:
        _positive("max_seq_len", self.max_seq_len)
        _one_of("dtype", self.dtype, DTYPES)


@dataclass(frozen=True)
class LinearQuant:
    scheme: str = "8da4w"  # int8 dynamic activations + int4 groupwise weights
    group_size: int = 32  # 0: one scale per output channel (8da8w)
    scale_algorithm: str = "affine"

    def __post_init__(self) -> None:
        _one_of("scheme", self.scheme, LINEAR_SCHEMES)
        if self.scheme == "8da8w":
            if self.group_size != 0:
                raise _Invalid("group_size", "8da8w has one scale per output channel; set 0")
        else:
            _positive("group_size", self.group_size)
        if self.scheme == "8da4w" and self.group_size % 32:
            # executorch 1.5.1's XNNPACK partitioner asserts on anything else at lowering time
            raise _Invalid("group_size", f"XNNPACK delegates multiples of 32, got {self.group_size}")
        _one_of("scale_algorithm", self.scale_algorithm, SCALE_ALGORITHMS[self.scheme])

    def label(self) -> str:
        """One name per precision, as the manifest's precision map writes it."""
        group = "per-channel" if self.group_size == 0 else f"g{self.group_size}"
        return f"{self.scheme} {group} {self.scale_algorithm}"


@dataclass(frozen=True)
class MixedPrecision:
    """Per-linear precision chosen by measured sensitivity (``exporter/mixed.py``): every linear
    starts at ``quantization.linear``; those whose quantization error costs the most (diagonal
    Fisher information of the fp32 model on calibration text, times the squared weight error)
    per extra byte are raised to a ``candidates`` precision, until the calibration text's
    perplexity ratio to fp32 is at most ``max_perplexity_ratio`` or the weights would exceed
    ``max_size_ratio`` times their size with every linear at ``quantization.linear``."""

    candidates: tuple[LinearQuant, ...] = ()
    max_size_ratio: float = 1.15
    # 1.0: spend the whole size budget (no quantized model reaches fp32 exactly)
    max_perplexity_ratio: float = 1.0
    text: str = "calibration"
    # windows of calibration text for the Fisher information and for the perplexity checks
    windows: int = 8
    window_tokens: int = 128
    seed: int = 0
    # fixed, as for QAT: the Fisher sums and the measured cut depend on the thread count
    threads: int = 2

    def __post_init__(self) -> None:
        if not self.candidates:
            raise _Invalid("candidates", "must list at least one precision to raise linears to")
        if self.max_size_ratio < 1:
            raise _Invalid("max_size_ratio", f"must be >= 1, got {self.max_size_ratio}")
        if self.max_perplexity_ratio < 1:
            raise _Invalid("max_perplexity_ratio", f"must be >= 1, got {self.max_perplexity_ratio}")
        _one_of("text", self.text, TRAINING_TEXTS)
        _positive("windows", self.windows)
        _positive("window_tokens", self.window_tokens)
        _positive("threads", self.threads)


@dataclass(frozen=True)
class QuantizationAwareTraining:
    """torchao QAT (``exporter/qat.py``): the linears are fake-quantized at their planned precision
    and trained for ``steps`` windows of calibration text to match the fp32 model's own next-token
    distributions (KL), then converted. The same inputs give the same weights: the window order
    comes from ``seed`` and the thread count is fixed (float sums depend on it)."""

    steps: int = 150
    window_tokens: int = 256
    learning_rate: float = 3e-5
    text: str = "calibration"
    seed: int = 0
    threads: int = 2

    def __post_init__(self) -> None:
        _positive("steps", self.steps)
        _positive("window_tokens", self.window_tokens)
        _positive("learning_rate", self.learning_rate)
        _one_of("text", self.text, TRAINING_TEXTS)
        _positive("threads", self.threads)


# Shipped texts the build may choose between quantized models on (``quantization.gptq.escalate``):
# from sources that are neither calibration nor judging text.
SELECTION_TEXTS = ("select-prose", "select-code")


@dataclass(frozen=True)
class Escalation:
    """After the tuning, more int8 where text from a third source says the model needs it
    (``exporter/quant/escalate.py``): the quantized model is scored against fp32 on ``texts``; while
    its perplexity ratio over all their tokens is over ``aim``, the next step of precision (each
    block's int8 choice pushed to a lower output-error target, the head's costliest rows or all of
    it to int8), whichever
    measures the most gain per byte, is taken while the weights stay within ``aim_size_ratio``
    times their all-4-bit bytes; while the ratio is over ``bar``, within ``max_size_ratio``."""

    texts: tuple[str, ...] = SELECTION_TEXTS
    tokens: int = 1024
    window_tokens: int = 512
    aim: float = 1.05
    aim_size_ratio: float = 1.15
    bar: float = 1.10
    max_size_ratio: float = 2.0
    # each block step halves the blocks' output-error target
    max_steps: int = 8

    def __post_init__(self) -> None:
        if not self.texts:
            raise _Invalid("texts", "needs at least one text")
        for text in self.texts:
            _one_of("texts", text, SELECTION_TEXTS)
        _positive("tokens", self.tokens)
        _positive("window_tokens", self.window_tokens)
        _positive("max_steps", self.max_steps)
        if not 1 <= self.aim <= self.bar:
            raise _Invalid("aim", f"must be in [1, bar], got {self.aim} (bar {self.bar})")
        if not 1 <= self.aim_size_ratio <= self.max_size_ratio:
            raise _Invalid("aim_size_ratio", f"must be in [1, max_size_ratio], got {self.aim_size_ratio}")


@dataclass(frozen=True)
class StreamedGptq:
    """Tuning in memory bounded by one block (``exporter/quant/sequential.py``): the checkpoint is
    visited a block at a time; each linear is solved by GPTQ onto the recipe's grid with the
    Hessian of its inputs as the already-quantized blocks before it produce them on ``windows``
    windows of calibration text; within each block, the linears whose int8 version lowers the
    block's measured output error most per extra byte go int8 per channel, up to
    ``int8_size_ratio`` times the block's all-int4 bytes (1.0: none)."""

    windows: int = 32
    window_tokens: int = 256
    # GPTQ's dampening of the Hessian, times its mean diagonal
    damp: float = 0.01
    # columns in order of decreasing input energy, group scales fixed before the solve
    act_order: bool = False
    # each group's scale shrunk from its absolute maximum where that rounds with less error
    clip_search: bool = False
    # the output projection's weights: 4 (the recipe's int4 groups) or 8 (int8 per channel)
    head_bits: int = 4
    # Large vocabularies: the embedding (head) goes 8-bit where its 4-bit version alone costs more
    # than this many nats per token of KL against fp32, measured on the calibration text. Unset: never.
    embedding_max_kl: float | None = None
    head_max_kl: float | None = None
    int8_size_ratio: float = 1.18
    # Past int8_size_ratio, a block whose measured output error (relative to its output's energy)
    # is still above this target raises more linears, in the same order, up to int8_max_ratio
    # times its all-int4 bytes. Unset: the ratio alone decides.
    int8_error_target: float | None = None
    int8_max_ratio: float = 1.6
    # windows on which each block's output error is measured for the int8 choice
    measure_windows: int = 4
    text: str = "calibration"
    # fixed: the Hessian sums and the block forwards depend on the thread count
    threads: int = 2
    escalate: Escalation | None = None

    def __post_init__(self) -> None:
        _positive("windows", self.windows)
        _positive("window_tokens", self.window_tokens)
        if not 0 <= self.damp < 1:
            raise _Invalid("damp", f"must be in [0, 1), got {self.damp!r}")
        if self.int8_size_ratio < 1:
            raise _Invalid("int8_size_ratio", f"must be >= 1, got {self.int8_size_ratio}")
        if self.int8_max_ratio < self.int8_size_ratio:
            raise _Invalid("int8_max_ratio", f"must be >= int8_size_ratio, got {self.int8_max_ratio}")
        if self.int8_error_target is not None and not 0 < self.int8_error_target < math.inf:
            target = self.int8_error_target
            raise _Invalid("int8_error_target", f"must be a finite number > 0, got {target!r}")
        _one_of("head_bits", self.head_bits, (4, 8))
        for key in ("embedding_max_kl", "head_max_kl"):
            value = getattr(self, key)
            if value is not None and not (0 <= value < math.inf):
                raise _Invalid(key, f"must be a finite number >= 0, got {value!r}")
        if not 0 < self.measure_windows <= self.windows:
            raise _Invalid("measure_windows", f"must be in [1, windows], got {self.measure_windows}")
        _one_of("text", self.text, TRAINING_TEXTS)
        _positive("threads", self.threads)


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
    mixed: MixedPrecision | None = None
    qat: QuantizationAwareTraining | None = None
    gptq: StreamedGptq | None = None

    def __post_init__(self) -> None:
        tuned = [k for k in ("mixed", "qat", "gptq") if getattr(self, k) is not None]
        if self.gptq is not None and len(tuned) > 1:
            # the streamed path never holds the whole model, which both whole-model tunings need
            raise _Invalid(
                "gptq", "is a tuning of its own: set quantization.mixed and quantization.qat to false"
            )
        if self.mixed is not None and self.qat is not None and self.mixed.text != self.qat.text:
            raise _Invalid("qat.text", "must be the same text as quantization.mixed.text")
        if tuned and (self.linear is None or self.linear.scheme != "8da4w"):
            raise _Invalid(tuned[0], "needs quantization.linear with scheme '8da4w'")
        if self.qat is not None and self.linear is not None and self.linear.scale_algorithm != "affine":
            # torchao's fake quantizer chooses scales by absolute maximum: train and convert alike
            raise _Invalid("linear.scale_algorithm", "QAT trains with 'affine' scales; set 'affine'")
        for i, c in enumerate(self.mixed.candidates if self.mixed else ()):
            if SCHEME_BACKEND[c.scheme] != "xnnpack":
                raise _Invalid(f"mixed.candidates[{i}].scheme", "must be '8da4w' or '8da8w'")
            if self.qat is not None and c.scale_algorithm != "affine":
                raise _Invalid(f"mixed.candidates[{i}].scale_algorithm", "QAT trains with 'affine'")


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
    # Judged, reported per kind in the manifest: shipped texts from sources no calibration text
    # comes from, each scored over judge_tokens tokens against fp32 streamed from the checkpoint,
    # with a bootstrap interval (exporter/gate/judge.py); a build is refused where any text's
    # perplexity ratio is over judge_max_perplexity_ratio (unset: reported only)
    judge_texts: tuple[str, ...] = ()
    judge_tokens: int = 1024
    judge_max_perplexity_ratio: float | None = None
    # torch threads of every stage that measures (fp32 reference logits, the gate, golden vectors):
    # float sums depend on the count, and the manifest must not depend on the machine's cores
    threads: int = 2

    def __post_init__(self) -> None:
        _positive("threads", self.threads)
        _positive("judge_tokens", self.judge_tokens)
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
        limit = self.judge_max_perplexity_ratio
        if limit is not None and limit < 1:
            raise _Invalid("judge_max_perplexity_ratio", f"must be >= 1, got {limit}")
        if limit is not None and not self.judge_texts:
            raise _Invalid("judge_max_perplexity_ratio", "needs validation.judge_texts to judge")


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
            wanted = SCHEME_BACKEND[linear.scheme]
            if self.backend != wanted:
                raise _Invalid("quantization.linear.scheme", f"{linear.scheme!r} needs backend {wanted!r}")
            if linear.scheme == "int4_weight_only" and self.export.dtype != "bfloat16":
                raise _Invalid("export.dtype", "int4_weight_only runs bf16 activations; set 'bfloat16'")
        if self.backend == "aoti" and self.quantization.embedding is not None:
            raise _Invalid("quantization.embedding", "no packed low-bit embedding kernel under aoti")
        escalate = None if self.quantization.gptq is None else self.quantization.gptq.escalate
        judged = {self.validation.text, *self.validation.judge_texts}
        if escalate is not None and (shared := sorted(judged & set(escalate.texts))):
            raise _Invalid(
                "validation",
                f"text {shared[0]!r} is also quantization.gptq.escalate's: a build judged on the "
                "text it was chosen on measures the choice, not the model",
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def tradeoff(self) -> str:
        """What the recipe costs and keeps, in one line (``exporter recipes``)."""
        q = self.quantization
        weights = "fp32" if q.linear is None else q.linear.label()
        if self.export.dtype != "float32":
            weights += f", {self.export.dtype} activations"
        parts = [f"linears {weights}"]
        if q.mixed is not None:
            raised = " / ".join(c.label().rsplit(" ", 1)[0] for c in q.mixed.candidates)
            parts.append(f"sensitive ones raised to {raised} within x{q.mixed.max_size_ratio} bytes")
        if q.qat is not None:
            parts.append(f"QAT {q.qat.steps} steps x {q.qat.window_tokens} tokens")
        if q.embedding is not None:
            parts.append(f"embedding int{q.embedding.bits} g{q.embedding.group_size}")
        parts.append(f"gate: perplexity <= x{self.validation.max_perplexity_ratio} fp32")
        if self.validation.judge_max_perplexity_ratio is not None:
            judged = ", ".join(self.validation.judge_texts)
            parts.append(f"<= x{self.validation.judge_max_perplexity_ratio} on {judged}")
        return "; ".join(parts)

    def calibration_text(self) -> str | None:
        """The shipped text the quantization is tuned on, if it is tuned at all."""
        tuned = self.quantization.mixed or self.quantization.qat or self.quantization.gptq
        return None if tuned is None else tuned.text

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def recipe_path(name_or_path: str) -> Path:
    """A recipe name (file in recipes/) or a path to a TOML file."""
    path = Path(name_or_path)
    try:
        exists = path.exists()
    except OSError:  # a name the OS refuses (too long): no file here, so it names a shipped recipe
        exists = False
    if path.suffix == ".toml" or exists:
        return path
    return RECIPES_DIR / f"{name_or_path}.toml"


def list_recipes() -> list[Path]:
    return sorted(RECIPES_DIR.glob("*.toml"))


def load_recipe(name_or_path: str, overrides: tuple[str, ...] = ()) -> Recipe:
    path = recipe_path(name_or_path)
    try:
        found = path.is_file()
        data = _parse_toml(path.read_text(encoding="utf-8")) if found else {}
    except OSError as e:  # a name the OS refuses (too long) or a file it will not let us read
        raise RecipeError(path, f"cannot read the recipe ({e.strerror or e})") from e
    except ValueError as e:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise RecipeError(path, f"not valid TOML ({e})") from e
    if not found:
        known = ", ".join(p.stem for p in list_recipes())
        raise RecipeError(path, f"recipe not found (shipped recipes: {known})")
    for item in overrides:
        _apply_override(path, data, item)
    return _build(Recipe, data, path, "")


def recipe_from_dict(data: dict[str, Any], source: Path) -> Recipe:
    """A resolved recipe as stored in a manifest, checked like a file."""
    return _build(Recipe, data, source, "")  # type: ignore[no-any-return]


def _parse_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads``, where nesting too deep for its recursive parser is a ValueError like its other
    refusals (it also raises a plain ValueError for integers beyond Python's int-to-string limit)."""
    try:
        return tomllib.loads(text)
    except RecursionError as e:
        raise ValueError("nested too deeply") from e


def _apply_override(path: Path, data: dict[str, Any], item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise RecipeError(path, f"--set {item!r}: expected key=value")
    shown = _printable(key)
    try:
        value = _parse_toml(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string: --set backend=aoti
    except ValueError as e:
        raise RecipeError(path, f"--set {shown}: not a valid value ({e})") from e
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise RecipeError(path, f"--set {shown}: {part!r} is not a table")
    if value is False and isinstance(node.get(leaf), dict):
        # an optional table is switched off: --set quantization.qat=false
        del node[leaf]
        return
    node[leaf] = value


def _printable(text: str) -> str:
    """A user's key on one line: newlines and other unprintable characters as escapes."""
    return text if text.isprintable() else repr(text)[1:-1]


def _build(cls: type, data: Any, path: Path, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise RecipeError(path, f"{prefix.rstrip('.') or 'recipe'}: expected a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = _printable(f"{prefix}{unknown[0]}")
        raise RecipeError(path, f"unknown key '{key}' (known: {', '.join(sorted(names))})")
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


def _convert_tuple(inner: Any, value: Any, path: Path, key: str) -> tuple[Any, ...]:
    """A list of strings, or a list of tables (TOML's array of inline tables) for a dataclass."""
    if dataclasses.is_dataclass(inner):
        if not isinstance(value, list):
            raise RecipeError(path, f"{key}: expected a list of tables, got {value!r}")
        return tuple(_build(inner, v, path, f"{key}[{i}].") for i, v in enumerate(value))  # type: ignore[arg-type]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecipeError(path, f"{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def _convert(hint: Any, value: Any, path: Path, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):  # `X | None`: absent, or None in a manifest
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _convert(inner, value, path, key)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, key + ".")  # type: ignore[arg-type]
    if origin is tuple:
        return _convert_tuple(typing.get_args(hint)[0], value, path, key)
    if origin is Literal:
        hint = str
    expected = {int: (int,), float: (float, int), str: (str,), bool: (bool,)}[hint]
    if not isinstance(value, expected) or (hint is not bool and isinstance(value, bool)):
        raise RecipeError(path, f"{key}: expected {hint.__name__}, got {value!r}")
    if hint is float and not math.isfinite(float(value)):
        raise RecipeError(path, f"{key}: expected a finite number, got {value!r}")
    return float(value) if hint is float else value
