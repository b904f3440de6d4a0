"""The build: a flat sequence of functions, recipe + checkpoint -> published artifact folder.

load -> reference (fp32 figures) -> quantize -> export -> lower -> validate -> publish. Everything is
written into a hidden temporary folder beside the target and moved into place only after validation
passed, so a failed or interrupted build leaves the previous artifact untouched and no partial one.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backends import Backend, Stepper, get_backend

from ..artifact.golden import DYNAMIC_QUANT_RTOL, FLOAT_RTOL, GOLDEN, make_golden
from ..artifact.manifest import kernel_libraries, tool_versions, write_json_atomically, write_manifest
from ..artifact.publish import make_staging, publish, target_lock
from ..artifact.seal import write_sealed
from ..errors import ArtifactError, CheckpointError, ValidationError
from ..gate.inputs import GateInputs, gate_inputs
from ..gate.judge import judge, judged_failures
from ..gate.validate import model_teacher, validate
from ..model.checkpoint import (
    Checkpoint,
    check_finite,
    digest_files,
    load_model,
    open_checkpoint,
    sha256_file,
)
from ..model.tokenizer import TokenizerInfo, load_tokenizer, tokenizer_info
from ..model.transformer import Transformer
from ..model.transforms import for_export
from ..plumbing.memory import available_memory_bytes, peak_rss_mb, release_memory
from ..plumbing.native_logs import native_logs_captured
from ..plumbing.threads import fixed_threads
from ..quant.configs import precision_map, quantize_model
from ..quant.sequential import calibration_windows, gptq_module
from ..quant.stream import DTYPES, stream_module
from ..quant.tune import (
    calibration_ids,
    check_tuning_memory,
    needs_whole_model,
    selection_ids,
    tuned_module,
)
from ..recipe import Recipe, load_recipe, recipe_path
from .cache import remember, reuse
from .fits import check_fits
from .plan import build_key

log = logging.getLogger("exporter")

DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[1] / "data" / "pycode-4m"
DEFAULT_OUT = Path("artifacts")
FAILED_SUFFIX = ".failed.json"
# Decode steps per gate prompt stored as golden vectors (a few: they are a fingerprint, not a gate).
GOLDEN_DECODE_STEPS = 8


@contextmanager
def stage(timings: dict[str, Any], name: str) -> Iterator[None]:
    log.info("[%s] ...", name)
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    timings[name] = {"seconds": round(seconds, 3), "peak_rss_mb": round(peak_rss_mb(), 1)}
    log.info("[%s] done in %.1f s (peak RSS %.0f MB)", name, seconds, peak_rss_mb())


@dataclass(frozen=True)
class BuildInputs:
    recipe: Recipe
    recipe_file: Path
    checkpoint: Checkpoint
    tokenizer: Any
    tokenizer_info: TokenizerInfo
    target: Path
    gate: GateInputs
    # the shipped text a tuned recipe calibrates and trains on: ids, and what the manifest says of it
    calibration: tuple[list[int], dict[str, Any]] | None = None
    # the texts a tuned recipe's escalation chooses on, by name (quantization.gptq.escalate)
    selection: dict[str, list[int]] = field(default_factory=dict)


def prepare(
    recipe_arg: str, checkpoint: Path | None, out: Path | None, overrides: tuple[str, ...]
) -> BuildInputs:
    """Every check that needs no weights: recipe, config, tokenizer, the gate's text and prompts
    against the cache length, output folder."""
    recipe = load_recipe(recipe_arg, overrides)
    recipe_file = recipe_path(recipe_arg)
    ckpt = open_checkpoint(checkpoint or DEFAULT_CHECKPOINT)
    check_fits(recipe, ckpt.args, recipe_file)
    check_tuning_memory(recipe, ckpt.args, recipe_file, available_memory_bytes())
    tokenizer = load_tokenizer(ckpt.tokenizer_path)
    info = tokenizer_info(ckpt.path, ckpt.config, tokenizer)
    if info.vocab_size > ckpt.args.vocab_size:
        raise CheckpointError(
            ckpt.tokenizer_path,
            f"tokenizer has {info.vocab_size} tokens, the model's vocab_size is {ckpt.args.vocab_size}",
        )
    target = (out or DEFAULT_OUT) / ckpt.name / recipe.name
    gate = gate_inputs(recipe, recipe_file, tokenizer, info, ckpt.path)
    name = recipe.calibration_text()
    calibration = None if name is None else calibration_ids(name, tokenizer, info, recipe_file)
    if calibration is not None and recipe.quantization.gptq is not None:
        calibration_windows(calibration[0], recipe.quantization.gptq, recipe_file)  # enough text?
    selection = selection_ids(recipe, tokenizer, info, recipe_file)
    return BuildInputs(recipe, recipe_file, ckpt, tokenizer, info, target, gate, calibration, selection)


def export_program(module: torch.nn.Module, max_seq_len: int) -> torch.export.ExportedProgram:
    """``forward(tokens int64[1, T], input_pos int64[1])`` with T dynamic in [1, max_seq_len - 1].

    One below the cache length, as ExecuTorch's own export does: the bound T == max_seq_len trips
    a shape guard in torchao's int4 CPU path, and a full-length prompt leaves no room to decode."""
    seq = torch.export.Dim("seq", min=1, max=max_seq_len - 1)
    example = (torch.zeros(1, 2, dtype=torch.long), torch.tensor([0]))
    with torch.no_grad():
        return torch.export.export(module, example, dynamic_shapes=({1: seq}, None), strict=False)


def stored_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor takes as stored; a quantized tensor subclass counts its packed parts."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        return sum(stored_bytes(getattr(t, inner)) for inner in t.__tensor_flatten__()[0])
    return t.nbytes


def weight_bytes(program: torch.export.ExportedProgram) -> int:
    """Bytes of the program's parameters as stored."""
    return sum(stored_bytes(program.state_dict[n]) for n in program.graph_signature.parameters)


def constant_methods(inputs: BuildInputs) -> dict[str, Any]:
    """What ExecuTorch's LLM runner reads from the program before it generates."""
    args, info, export = inputs.checkpoint.args, inputs.tokenizer_info, inputs.recipe.export
    methods: dict[str, Any] = {
        "get_max_seq_len": export.max_seq_len,
        "get_max_context_len": export.max_seq_len,
        "get_vocab_size": args.vocab_size,
        "get_n_layers": args.n_layers,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": export.custom_sdpa,
        "enable_dynamic_shape": True,
        "get_eos_ids": list(info.eos_ids),
    }
    if info.bos_id is not None:
        methods["get_bos_id"] = info.bos_id
    return methods


def prepare_module(recipe: Recipe, model: Transformer) -> torch.nn.Module:
    """fp32 eager model -> the module that is exported: compute dtype, quantization, transforms."""
    model.to(DTYPES[recipe.export.dtype])
    quantize_model(model, recipe.quantization)
    return for_export(recipe, model)


def eager_module(recipe: Recipe, ckpt: Checkpoint) -> torch.nn.Module:
    """The eager module a build of ``recipe`` exports, for benches and tests: a tuned recipe is
    tuned again (deterministic, so the same weights), any other is quantized as it is streamed."""
    name = recipe.calibration_text()
    if name is None:
        return prepare_module(recipe, load_model(ckpt, recipe.export.max_seq_len))
    tok = load_tokenizer(ckpt.tokenizer_path)
    info = tokenizer_info(ckpt.path, ckpt.config, tok)
    ids, _ = calibration_ids(name, tok, info, Path(recipe.name))
    if recipe.quantization.gptq is None:
        return tuned_module(ckpt, recipe, [0, 0], ids)[0]
    selection = selection_ids(recipe, tok, info, Path(recipe.name))
    return gptq_module(ckpt, recipe, [0, 0], ids, selection)[0]


def failed_path(target: Path) -> Path:
    """Where a build that fails its gate leaves its figures: beside the target, never inside it."""
    return target.with_name(target.name + FAILED_SUFFIX)


def build(
    recipe_arg: str,
    checkpoint: Path | None = None,
    out: Path | None = None,
    overrides: tuple[str, ...] = (),
    force: bool = False,
) -> Path:
    """Build, validate and publish one artifact; returns its folder. Raises ``ExporterError``."""
    if not force and (done := reuse(recipe_arg, checkpoint, out, overrides)) is not None:
        # a finished artifact with the same build key is there (exporter.build.cache): the target is
        # good, so a record of a failed attempt with other inputs no longer describes it
        failed_path(done.folder).unlink(missing_ok=True)
        return done.folder
    inputs = prepare(recipe_arg, checkpoint, out, overrides)
    backend = get_backend(inputs.recipe.backend)
    # one build of a target at a time; taking the lock also repairs what killed builds left
    with target_lock(inputs.target):
        staging = make_staging(inputs.target)
        try:
            manifest, build_info = _build_into(inputs, backend, staging)
            write_manifest(staging, manifest, build_info)
            publish(staging, inputs.target)
            failed_path(inputs.target).unlink(missing_ok=True)  # the target is good again
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return remember(inputs.target)  # into $EXPORTER_CACHE, if set


def _build_into(
    inputs: BuildInputs, backend: Backend, staging: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint is streamed into the quantized module (fp32 reference logits computed on the
    way); the gate then runs the artifact, and eager teacher-forced along the artifact's tokens.
    Returns the manifest (what follows from the inputs) and the build record (what varies)."""
    recipe, ckpt, gate = inputs.recipe, inputs.checkpoint, inputs.gate
    timings: dict[str, Any] = {}
    measuring = recipe.validation.threads  # the reference logits are computed while loading
    with stage(timings, "load_quantize"), fixed_threads(measuring):
        check_finite(ckpt)
        tuning: dict[str, Any] = {}
        if needs_whole_model(recipe) or recipe.quantization.gptq is not None:
            assert inputs.calibration is not None  # prepare() reads it for every tuned recipe
            if recipe.quantization.gptq is not None:
                module, reference, tuning = gptq_module(
                    ckpt, recipe, gate.ids, inputs.calibration[0], inputs.selection
                )
            else:
                module, reference, tuning = tuned_module(ckpt, recipe, gate.ids, inputs.calibration[0])
            tuning["calibration_text"] = inputs.calibration[1]
        else:
            module, reference = stream_module(ckpt, recipe, gate.ids)
        precision = precision_map(module.model)
        release_memory()
    with stage(timings, "export"):
        held = [export_program(module, recipe.export.max_seq_len)]
        weights = weight_bytes(held[0])
    with stage(timings, "lower"):
        lowered = backend.lower(
            held.pop(),
            constant_methods(inputs),
            staging / f"model{backend.suffix}",
            lean_lowering=recipe.export.lean_lowering,
        )
        release_memory()
    with stage(timings, "validate"), native_logs_captured(), fixed_threads(measuring):
        # No local name for the loaded artifact: ``validate`` drops the last reference to it before
        # eager runs, so the two are never resident together.
        figures = validate(
            _load_or_fail(inputs, backend, lowered.path, timings),
            model_teacher(module.model),
            gate.prompts,
            reference,
            recipe.validation,
        )
    figures["text"] = gate.text
    figures["chat_prompts"] = gate.chat_prompts
    if gate.judged:  # reported with the figures of a refused build too
        del module  # the fp32 reference streams from the checkpoint: the eager module is done with
        release_memory()
        with stage(timings, "judge"), native_logs_captured(), fixed_threads(measuring):
            v = recipe.validation
            figures["judged"] = judge(
                ckpt,
                backend.load(lowered.path),
                gate.judged,
                recipe.export.max_seq_len,
                v.judge_tokens,
                v.clear_margin,
            )
        figures["failures"] = [
            *figures["failures"],
            *judged_failures(figures["judged"], v.judge_max_perplexity_ratio),
        ]
        figures["passed"] = not figures["failures"]
    quantization = {"precision": precision, **({"tuning": tuning} if tuning else {})}
    if not figures["passed"]:
        raise _gate_failed(inputs, figures, timings, quantization)
    with stage(timings, "golden"), native_logs_captured(), fixed_threads(measuring):
        golden = make_golden(
            backend.load(lowered.path), gate.prompts, GOLDEN_DECODE_STEPS, rtol=golden_rtol(recipe)
        )
        write_sealed(staging / GOLDEN, golden)
    shutil.copyfile(ckpt.tokenizer_path, staging / "tokenizer.json")
    # A backend that repacks weights (XNNPACK) says what it stored; otherwise the program's own.
    runtime = {"weight_bytes": weights, **lowered.runtime}
    build_info = {"timings": timings, "tuning_seconds": split_tuning_seconds(tuning)}
    manifest = {**assemble_manifest(inputs, lowered.path, runtime, figures), "quantization": quantization}
    return manifest, build_info


def golden_rtol(recipe: Recipe) -> float:
    """Programs that quantize activations at run time get the wider cross-CPU tolerance."""
    linears = [recipe.quantization.linear] if recipe.quantization.linear else []
    if recipe.quantization.mixed is not None:
        linears += list(recipe.quantization.mixed.candidates)
    dynamic = any(q.scheme.startswith("8da") for q in linears)
    return DYNAMIC_QUANT_RTOL if dynamic else FLOAT_RTOL


def split_tuning_seconds(tuning: dict[str, Any]) -> dict[str, Any]:
    """Take the wall times out of the tuning record (they go to build-info.json, the rest of the
    record follows from the inputs and stays in the manifest)."""
    volatile = ("seconds", "seconds_per_million_parameters")
    return {
        part: {k: record.pop(k) for k in volatile if k in record}
        for part, record in tuning.items()
        if isinstance(record, dict) and any(k in record for k in volatile)
    }


def _load_or_fail(inputs: BuildInputs, backend: Backend, path: Path, timings: dict[str, Any]) -> Stepper:
    """The artifact in its runtime; a program that does not load fails the gate like any other."""
    try:
        return backend.load(path)
    except ArtifactError as e:
        figures = {"passed": False, "failures": [f"the built program does not load: {e.message}"]}
        raise _gate_failed(inputs, figures, timings) from None


def _gate_failed(
    inputs: BuildInputs,
    figures: dict[str, Any],
    timings: dict[str, Any],
    quantization: dict[str, Any] | None = None,
) -> ValidationError:
    """Write the failed build's figures beside the target; the error names that file."""
    record = {
        **({"quantization": quantization} if quantization else {}),
        "failed": True,
        "model": inputs.checkpoint.name,
        "checkpoint": str(inputs.checkpoint.path),
        "recipe": {"name": inputs.recipe.name, "resolved": inputs.recipe.to_dict()},
        "tools": tool_versions(),
        "validation": figures,
        "timings": timings,
    }
    path = write_json_atomically(failed_path(inputs.target), record)
    return ValidationError(
        path, "validation failed, nothing published (figures in this file): " + "; ".join(figures["failures"])
    )


def executorch_needs(runtime: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    if runtime.get("format") != "executorch-pte":
        return {}
    return {
        "executorch_version": versions["executorch"],
        "kernel_libraries": kernel_libraries(runtime.get("operators_outside_delegate", [])),
    }


def assemble_manifest(
    inputs: BuildInputs,
    model_file: Path,
    runtime: dict[str, Any],
    figures: dict[str, Any],
) -> dict[str, Any]:
    recipe, ckpt, args = inputs.recipe, inputs.checkpoint, inputs.checkpoint.args
    size = model_file.stat().st_size
    params = args.parameter_count()
    item = DTYPES[recipe.export.dtype].itemsize
    # rings of sliding-window layers hold their window, not max_seq_len positions
    kv_bytes = 2 * args.cache_positions(recipe.export.max_seq_len) * args.n_kv_heads * args.head_dim * item
    versions = tool_versions()
    ckpt_files = [ckpt.path / "config.json", *ckpt.weight_files, ckpt.tokenizer_path]
    return {
        "artifact": {
            "file": model_file.name,
            "format": runtime.get("format"),
            "sha256": sha256_file(model_file),
            "size_bytes": size,
            "bits_per_parameter": round(size * 8 / params, 3),
            # the weights alone, as stored in the program (file size also holds code, cache, metadata)
            "weight_bytes_per_parameter": round(runtime["weight_bytes"] / params, 4),
        },
        "model": {
            "name": ckpt.name,
            "architecture": ckpt.architecture,
            "parameters": params,
            "checkpoint_sha256": digest_files(ckpt_files),
            "args": {k: v for k, v in vars(args).items() if k != "rope_scaling"}
            | {"rope_scaling": None if args.rope_scaling is None else vars(args.rope_scaling)},
        },
        "build_key": build_key(ckpt.path, recipe, inputs.recipe_file),
        "recipe": {
            "name": recipe.name,
            "file": inputs.recipe_file.name,
            "digest": recipe.digest(),
            "resolved": recipe.to_dict(),
        },
        "tools": versions,
        "runtime": {
            **runtime,
            **executorch_needs(runtime, versions),
            "method": "forward",
            "inputs": [
                {
                    "name": "tokens",
                    "dtype": "int64",
                    "shape": [1, "T"],
                    "T": [1, recipe.export.max_seq_len - 1],
                },
                {"name": "input_pos", "dtype": "int64", "shape": [1], "meaning": "position of tokens[0, 0]"},
            ],
            "outputs": [
                {
                    "name": "logits",
                    "dtype": "float32",
                    "shape": [1, args.vocab_size],
                    "meaning": "next-token logits after the last input token",
                }
            ],
            "kv_cache": {
                "inside_program": True,
                "layout": "[1, max_seq_len, n_kv_heads, head_dim]"
                if recipe.export.custom_sdpa
                else "[1, n_kv_heads, max_seq_len, head_dim]",
                # per layer: 0 = every position, W = a ring of min(W, max_seq_len) slots
                "layer_windows": [args.window(i) for i in range(args.n_layers)],
                "dtype": recipe.export.dtype,
                "bytes": kv_bytes,
            },
            "max_seq_len": recipe.export.max_seq_len,
            "constant_methods": constant_methods(inputs),
            "memory_estimate_bytes": {
                "weights": size,
                "kv_cache": kv_bytes,
                # planned buffers hold the KV cache and activations; fall back to the cache alone
                "total": size + max(kv_bytes, runtime.get("planned_memory_bytes", 0)),
            },
        },
        "tokenizer": {**inputs.tokenizer_info.to_dict(), "sha256": sha256_file(ckpt.tokenizer_path)},
        "validation": figures,
    }
