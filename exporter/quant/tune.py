"""The build path of recipes that tune their quantization on the model itself: a measured
mixed-precision plan (``quantization.mixed``) and/or quantization-aware training
(``quantization.qat``). Both need the whole fp32 model at once (backward passes through it), so
this path loads it whole instead of streaming a layer at a time; recipes without them keep the
streamed path (``stream.py``) and its memory.

checkpoint -> fp32 model -> reference logits on the gate's text -> plan -> QAT -> quantize ->
source transforms. The calibration text is a shipped text held out from every gate and evaluation.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import RecipeError
from ..gate.inputs import TEXTS, first_tokens
from ..gate.validate import Reference, full_logits
from ..model.checkpoint import Checkpoint, load_model
from ..model.tokenizer import encode
from ..model.transformer import ModelArgs
from ..model.transforms import LastTokenLogits, for_export
from ..plumbing.threads import fixed_threads
from ..recipe import LinearQuant, Recipe, StreamedGptq
from .configs import quantize_embedding, quantize_linears, untie_embeddings
from .precision import choose_precisions, linears
from .stream import DTYPES


def calibration_ids(
    name: str, tokenizer: Any, info: Any, recipe_file: Path
) -> tuple[list[int], dict[str, Any]]:
    """The shipped training (or selection) text ``name`` as token ids, and what the manifest says
    of it."""
    path = TEXTS / f"{name}.txt"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(recipe_file, f"calibration text {path} cannot be read ({e.strerror})") from e
    ids = encode(tokenizer, info, text)
    described = {
        "source": f"shipped:{name}",
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "tokens": len(ids),
    }
    return ids, described


def selection_ids(recipe: Recipe, tokenizer: Any, info: Any, recipe_file: Path) -> dict[str, list[int]]:
    """The escalation's selection texts (``quantization.gptq.escalate.texts``) as token ids; a text
    too short for ``escalate.tokens`` is a one-line recipe error."""
    gptq = recipe.quantization.gptq
    escalation = None if gptq is None else gptq.escalate
    if escalation is None:
        return {}
    out = {}
    for i, name in enumerate(escalation.texts):
        ids, _ = calibration_ids(name, tokenizer, info, recipe_file)
        key = f"quantization.gptq.escalate.texts[{i}]"
        out[name] = first_tokens(ids, escalation.tokens + 1, recipe_file, key, name, "escalate.tokens")
    return out


# Peak bytes per (untied) parameter of the whole-model path, from SmolLM2-135M (162.8 M untied
# parameters): QAT 6.98 GB (fp32 model, teacher, fake-quantized weights, gradients, Adam's two
# moments, activations); the mixed-precision plan alone keeps the model, a clone of each linear
# weight, its quantized candidates and the Fisher sums.
TUNING_BYTES_PER_PARAMETER = {"qat": 44, "mixed": 20}


# The streamed GPTQ path (``sequential.py``) peaks in one of two stages, in bytes. Both hold the
# process before any weight (torch, torchao, executorch imported) and the quantized model in eager
# form (int8 codes + bf16 group scales: 1.07 bytes per parameter). The block stage adds the block
# being tuned (fp32 weights, the solve's working copies, int4 and int8 results: 28 bytes per
# parameter), its Hessians (4 bytes per entry) and the calibration activations; the vocabulary
# stage adds, per entry of the vocabulary matrix [V, dim], the embedding and head as stored
# (memory-mapped), the gate's fp32 logits, the head's solve in row blocks and its joined codes,
# plus what the stage holds whatever the vocabulary (the probe windows' hidden states, the last
# block's freed pages). The build hands freed heap pages back after each block (2026-12-07); the
# vocabulary terms are fitted to the tuning stage's peak measured since (build-info, all three in
# the vocabulary stage): SmolLM2-135M 1,031, Qwen2.5-Coder-0.5B 2,120 and Gemma 3 270M 2,150 MiB,
# each within 25 MiB. The block terms give the Llama-3.2-1B shape's block stage as measured before
# that change (4,337 MiB against 4,165), so they may overstate it now (docs/quality.md).
GPTQ_BASE_BYTES = 540 * 2**20
GPTQ_BYTES_PER_MODEL_PARAMETER = 1.07
GPTQ_BYTES_PER_BLOCK_PARAMETER = 28
GPTQ_VOCAB_STAGE_BYTES = 150 * 2**20
GPTQ_BYTES_PER_VOCAB_ENTRY = 6.2
# The escalation's head-row steps (since stop 32) build a split head per size tried, each a copy of
# the 4-bit head less its int8 rows (1.07 bytes per entry), beside the whole 4-bit head, and the
# allocator keeps what the tried ones freed: fitted to the tuning stage's peak of the first builds
# with them (build-info): Qwen2.5-Coder-0.5B 2,525 MiB (estimate 2,566), Gemma 3 270M 2,751 (2,656).
GPTQ_ESCALATION_BYTES_PER_VOCAB_ENTRY = 3.3


def gptq_memory_bytes(args: ModelArgs, settings: StreamedGptq) -> int:
    """Estimated peak RSS of a streamed GPTQ tuning of a model of ``args``: the larger of its block
    stage and its vocabulary stage."""
    embed = args.vocab_size * args.dim
    block = args.parameter_count() - embed * (1 if args.tie_word_embeddings else 2)
    block //= args.n_layers
    attn_in, o_in = args.dim, args.n_heads * args.head_dim
    hessians = 4 * (2 * attn_in**2 + o_in**2 + args.hidden_dim**2)
    tokens = settings.windows * settings.window_tokens
    activations = 4 * (2 * tokens * args.dim + settings.window_tokens * (4 * args.hidden_dim + 4 * args.dim))
    model = GPTQ_BYTES_PER_MODEL_PARAMETER * (
        args.parameter_count() + (embed if args.tie_word_embeddings else 0)
    )
    block_stage = GPTQ_BYTES_PER_BLOCK_PARAMETER * block + hessians + activations
    per_entry = GPTQ_BYTES_PER_VOCAB_ENTRY + (
        GPTQ_ESCALATION_BYTES_PER_VOCAB_ENTRY if settings.escalate is not None else 0.0
    )
    vocabulary_stage = GPTQ_VOCAB_STAGE_BYTES + per_entry * embed
    return int(GPTQ_BASE_BYTES + model + max(block_stage, vocabulary_stage))


def check_tuning_memory(recipe: Recipe, args: ModelArgs, path: Path, available: int | None) -> None:
    """Refuse, before any weight is read, a tuning that cannot fit in ``available`` bytes."""
    quant = recipe.quantization
    if quant.gptq is not None:
        needed = gptq_memory_bytes(args, quant.gptq)
        if available is not None and needed > available:
            raise RecipeError(
                path,
                f"quantization.gptq: tuning this {args.parameter_count() / 1e9:.2f}B-parameter model "
                f"needs about {needed / 2**30:.1f} GiB, {available / 2**30:.1f} GiB is available; "
                "build without tuning: --set quantization.gptq=false",
            )
        return
    stage = "qat" if quant.qat is not None else "mixed" if quant.mixed is not None else None
    if stage is None or available is None:
        return
    parameters = args.parameter_count() + (args.vocab_size * args.dim if args.tie_word_embeddings else 0)
    needed = parameters * TUNING_BYTES_PER_PARAMETER[stage]
    if needed > available:
        off = (
            "quantization.qat=false --set quantization.mixed=false"
            if stage == "qat"
            else "quantization.mixed=false"
        )
        raise RecipeError(
            path,
            f"quantization.{stage}: tuning this {parameters / 1e9:.2f}B-parameter model holds it whole "
            f"(about {needed / 2**30:.1f} GiB), {available / 2**30:.1f} GiB is available; "
            f"build without tuning: --set {off}",
        )


def needs_whole_model(recipe: Recipe) -> bool:
    return recipe.quantization.mixed is not None or recipe.quantization.qat is not None


def tuning_window(recipe: Recipe) -> int:
    """The longest window of text the tuning runs through the model at once."""
    quant = recipe.quantization
    return max(
        quant.mixed.window_tokens if quant.mixed is not None else 0,
        quant.qat.window_tokens if quant.qat is not None else 0,
    )


def tuned_module(
    ckpt: Checkpoint,
    recipe: Recipe,
    gate_ids: Sequence[int],
    calibration: Sequence[int],
) -> tuple[LastTokenLogits, Reference, dict[str, Any]]:
    """The exported module for ``recipe``, eager fp32 logits on ``gate_ids`` and the record of
    the tuning (plan, training) for the manifest."""
    quant = recipe.quantization
    base = quant.linear
    assert base is not None  # the recipe checks that mixed/qat come with a linear scheme
    # Tuning windows may be longer than the exported cache: tune with room for them, export with
    # the recipe's own length.
    model = load_model(ckpt, max(recipe.export.max_seq_len, tuning_window(recipe)))
    reference = Reference(list(gate_ids), full_logits(model, gate_ids))
    untie_embeddings(model)
    record: dict[str, Any] = {}
    plan: dict[str, LinearQuant] = dict.fromkeys(linears(model), base)
    if quant.mixed is not None:
        start = time.perf_counter()
        with fixed_threads(quant.mixed.threads):
            chosen = choose_precisions(model, base, quant.mixed, calibration)
        plan = chosen.precision
        record["mixed"] = {
            **chosen.record,
            "threads": quant.mixed.threads,
            "seconds": round(time.perf_counter() - start, 1),
        }
    if quant.qat is not None:
        from .qat import distill

        record["qat"] = distill(model, plan, quant.qat, calibration)
        record["qat"]["seconds_per_million_parameters"] = round(
            record["qat"]["seconds"] / (ckpt.args.parameter_count() / 1e6), 3
        )
    else:
        quantize_linears(model, base, plan=plan)
    model.resize_cache(recipe.export.max_seq_len)
    dtype = DTYPES[recipe.export.dtype]
    with torch.no_grad():
        if quant.embedding is not None:
            quantize_embedding(model.tok_embeddings, quant.embedding, dtype)
        model.to(dtype)
    model.init_buffers()
    model.cast_rope(dtype)
    return for_export(recipe, model), reference, record
