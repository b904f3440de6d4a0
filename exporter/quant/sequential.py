"""Tuned quantization in memory bounded by one block: sequential GPTQ, streamed from the checkpoint.

The untuned path (``stream.py``) reads one block at a time from the memory-mapped checkpoint; this
keeps that property and tunes on the way. Calibration windows enter as embeddings; for each block:

1. its fp32 weights are read; it runs on the gate's text in fp32 (the reference logits) and, with
   hooks on its linears, on the calibration activations the quantized blocks before it produced,
   summing each input's Hessian ``X^T X`` (q/k/v share one, gate/up another);
2. every linear is solved by GPTQ onto the recipe's int4 grid (``gptq.py``);
3. the int8 choice: the block's output error against its fp32 output is measured on a few windows
   with every linear int4, then with each linear alone int8 per channel (GPTQ too); linears are
   raised in order of error removed per extra byte while the block stays within
   ``int8_size_ratio`` times its all-int4 bytes (with ``int8_error_target``, a block still above
   it raises more, up to ``int8_max_ratio``);
4. the calibration activations go through the quantized block to become the next block's inputs,
   and the block's weights become torchao tensors.

The working set is one fp32 block, its Hessians ([in, in] per distinct input), the calibration
activations (windows x tokens x dim, fp32) and the quantized model; the head is solved last, in
blocks of rows, with the Hessian of the final norm's outputs (``vocabulary.py``, which also measures
whether the embedding and the head go 8-bit). No fp32 copy of the model, no teacher
logits: the memory grows with the widest block, not with depth.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import RecipeError
from ..gate.judge import windows_of
from ..gate.reference import head_logits
from ..gate.validate import Reference
from ..model.checkpoint import Checkpoint, TensorSource, fill
from ..model.transformer import Rope, Transformer, TransformerBlock
from ..model.transforms import LastTokenLogits, for_export
from ..plumbing.memory import release_memory
from ..plumbing.progress import progress
from ..plumbing.threads import fixed_threads
from ..recipe import LinearQuant, Recipe, StreamedGptq
from .configs import stored_bytes_estimate
from .escalate import (
    HeadRows,
    Ladder,
    escalate,
    fp32_nll,
    ladder,
    loader,
    selection_measure,
    weight_bytes,
)
from .gptq import INT8, Prepared, Quantized, prepare, solve, to_torchao
from .stream import DTYPES
from .vocabulary import embed, vocabulary_precision

# Linears whose input is another's: one Hessian serves them all.
SHARED_INPUT = {
    "attention.wk": "attention.wq",
    "attention.wv": "attention.wq",
    "feed_forward.w3": "feed_forward.w1",
}


def calibration_windows(ids: Sequence[int], settings: StreamedGptq, path: Path) -> list[list[int]]:
    """``windows`` consecutive windows of ``window_tokens`` tokens, spread over the whole text; the
    build calls it before reading any weight, so a text too short is a one-line recipe error."""
    length = settings.window_tokens
    count = len(ids) // length
    if count < settings.windows:
        raise RecipeError(
            path,
            f"quantization.gptq.windows: the calibration text has {count} windows of {length} tokens, "
            f"{settings.windows} asked for",
        )
    stride = count // settings.windows
    return [list(ids[i * stride * length : (i * stride + 1) * length]) for i in range(settings.windows)]


def block_linears(block: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}


def block_hessians(
    block: TransformerBlock, xs: Sequence[torch.Tensor], rope: Rope, keep: int
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Input Hessians of the block's linears over ``xs``, and the block's outputs on the first
    ``keep`` windows (the fp32 targets of the int8 choice)."""
    linears = block_linears(block)
    sums = {n: torch.zeros(m.in_features, m.in_features) for n, m in linears.items() if n not in SHARED_INPUT}

    def hook(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def add(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            sums[name].addmm_(x.T, x)

        return add

    handles = [linears[n].register_forward_pre_hook(hook(n)) for n in sums]
    targets = []
    try:
        for i, x in enumerate(xs):
            y = block(x, rope, 0)
            if i < keep:
                targets.append(y)
    finally:
        for h in handles:
            h.remove()
    return {n: sums[SHARED_INPUT.get(n, n)] for n in linears}, targets


def _set_weights(linears: dict[str, nn.Linear], weights: dict[str, torch.Tensor]) -> None:
    for name, w in weights.items():
        linears[name].weight.data = w


def _output_error(
    block: TransformerBlock,
    xs: Sequence[torch.Tensor],
    ys: Sequence[torch.Tensor],
    rope: Rope,
) -> float:
    return sum(float((block(x, rope, 0) - y).square().sum()) for x, y in zip(xs, ys, strict=True))


def choose_int8(
    block: TransformerBlock,
    int4: dict[str, Quantized],
    int8: dict[str, Quantized],
    probe: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor], Rope],
    base: LinearQuant,
    settings: StreamedGptq,
) -> tuple[set[str], dict[str, float], list[tuple[str, float]]]:
    """The linears of ``block`` raised to int8 (see the module's docstring, step 3), the block's
    measured output error with all int4 and with the choice, relative to its output's energy, and,
    with ``escalate``, the linears left in the order with the error after raising each as well."""
    linears = block_linears(block)
    xs, ys, rope = probe
    energy = sum(float(y.square().sum()) for y in ys)
    _set_weights(linears, {n: q.dequantize() for n, q in int4.items()})
    all4 = _output_error(block, xs, ys, rope)
    extra = {
        n: stored_bytes_estimate(linears[n].weight.shape, INT8)
        - stored_bytes_estimate(linears[n].weight.shape, base)
        for n in linears
    }
    int4_bytes = sum(stored_bytes_estimate(m.weight.shape, base) for m in linears.values())
    budget = (settings.int8_size_ratio - 1) * int4_bytes
    gains = {}
    if settings.int8_size_ratio > 1:
        for name in linears:
            linears[name].weight.data = int8[name].dequantize()
            gains[name] = all4 - _output_error(block, xs, ys, rope)
            linears[name].weight.data = int4[name].dequantize()
    order = [n for n in sorted(gains, key=lambda n: gains[n] / extra[n], reverse=True) if gains[n] > 0]
    chosen: set[str] = set()
    for name in order:
        if extra[name] <= budget:
            chosen.add(name)
            budget -= extra[name]
    _set_weights(linears, {n: int8[n].dequantize() for n in chosen})
    final = _output_error(block, xs, ys, rope) if chosen else all4
    if settings.int8_error_target is not None:
        # more int8 only where the block is measurably worse than the target, one linear at a
        # time, each measured with the others (their gains do not add)
        budget += (settings.int8_max_ratio - settings.int8_size_ratio) * int4_bytes
        for name in order:
            if final / energy <= settings.int8_error_target:
                break
            if name not in chosen and extra[name] <= budget:
                chosen.add(name)
                budget -= extra[name]
                linears[name].weight.data = int8[name].dequantize()
                final = _output_error(block, xs, ys, rope)
    tail: list[tuple[str, float]] = []
    if settings.escalate is not None:
        # the rest of the order, measured one more linear at a time: the steps the escalation
        # (escalate.py) may take after the whole model is scored on selection text
        for name in order:
            if name not in chosen:
                linears[name].weight.data = int8[name].dequantize()
                tail.append((name, _output_error(block, xs, ys, rope) / energy))
    return chosen, {"int4": all4 / energy, "chosen": final / energy}, tail


@dataclasses.dataclass(frozen=True)
class SolvedBlock:
    """A block's linears on their grids: the chosen int8 ones and the int4 rest, with the block's
    measured output error (relative) all int4 and as chosen."""

    weights: dict[str, Quantized]
    int8: set[str]
    errors: dict[str, float]
    # with ``escalate``: the further raises in order, (linear, block error after it), and their
    # int8 solutions
    tail: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    reserve: dict[str, Quantized] = dataclasses.field(default_factory=dict)

    def grid(self, name: str, base: LinearQuant) -> LinearQuant:
        return INT8 if name in self.int8 else base


def solve_block(
    block: TransformerBlock, xs: list[torch.Tensor], rope: Rope, settings: StreamedGptq, base: LinearQuant
) -> SolvedBlock:
    """Steps 1-3 of the module's docstring on one fp32 block; its linears hold the solved weights
    (dequantized) afterwards."""
    hessians, targets = block_hessians(block, xs, rope, settings.measure_windows)
    linears = block_linears(block)
    weights = {n: m.weight.detach() for n, m in linears.items()}  # solve() works on its own copy
    shared: dict[int, Prepared] = {}  # one factorisation per distinct Hessian
    prepared: dict[str, Prepared] = {}
    for name, h in hessians.items():
        if id(h) not in shared:
            shared[id(h)] = prepare(h, settings.damp, settings.act_order)
        prepared[name] = shared[id(h)]
    del hessians, h  # the factors are all the solve needs; a 1B model's widest Hessian is 268 MB

    def gptq(name: str, q: LinearQuant) -> Quantized:
        return solve(weights[name], None, q, prepared=prepared[name], clip_search=settings.clip_search)

    int4 = {n: gptq(n, base) for n in linears}
    int8 = {n: gptq(n, INT8) for n in linears} if settings.int8_size_ratio > 1 else {}
    probe = (xs[: settings.measure_windows], targets, rope)
    chosen, errors, tail = choose_int8(block, int4, int8, probe, base, settings)
    solution = {n: int8[n] if n in chosen else int4[n] for n in linears}
    return SolvedBlock(solution, chosen, errors, tail, {n: int8[n] for n, _ in tail})


def finish_block(
    block: TransformerBlock,
    xs: list[torch.Tensor],
    rope: Rope,
    solved: SolvedBlock,
    base: LinearQuant,
    dtype: torch.dtype,
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Step 4: the next block's inputs through the solved block, whose weights become torchao
    tensors."""
    linears = block_linears(block)
    _set_weights(linears, {n: q.dequantize() for n, q in solved.weights.items()})
    outputs = [block(x, rope, 0) for x in xs]
    block.to(dtype)  # before the torchao tensors: a cast would widen their bf16 scales
    for name, linear in linears.items():
        q = solved.grid(name, base)
        linear.weight = nn.Parameter(to_torchao(solved.weights[name], q, dtype), requires_grad=False)
    record = {"int8": sorted(solved.int8), **solved.errors, "tail": solved.tail, "reserve": solved.reserve}
    return outputs, record


def tune_block(
    block: TransformerBlock,
    xs: list[torch.Tensor],
    rope: Rope,
    settings: StreamedGptq,
    base: LinearQuant,
    dtype: torch.dtype,
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Quantize one fp32 block in place (torchao tensors); returns the next block's inputs."""
    return finish_block(block, xs, rope, solve_block(block, xs, rope, settings, base), base, dtype)


def tuning_record(
    settings: StreamedGptq,
    vocab: dict[str, Any],
    blocks: list[dict[str, Any]],
    seconds: float,
    parameters: int,
) -> dict[str, Any]:
    """What the manifest says of the tuning (``quantization.tuning.gptq``)."""
    return {
        "method": "streamed GPTQ, int8 per block by measured output error",
        "windows": settings.windows,
        "window_tokens": settings.window_tokens,
        "damp": settings.damp,
        "act_order": settings.act_order,
        "clip_search": settings.clip_search,
        "int8_size_ratio": settings.int8_size_ratio,
        "int8_error_target": settings.int8_error_target,
        "int8_max_ratio": settings.int8_max_ratio,
        # each measured alone against fp32 on the first measure_windows calibration windows, nats/token
        "vocabulary": vocab,
        "threads": settings.threads,
        "int8_linears": sum(len(b["int8"]) for b in blocks),
        "blocks": [
            {"int8": b["int8"], "error_int4": round(b["int4"], 6), "error": round(b["chosen"], 6)}
            for b in blocks
        ],
        "seconds": round(seconds, 1),
        "seconds_per_million_parameters": round(seconds / (parameters / 1e6), 3),
    }


def gptq_module(
    ckpt: Checkpoint,
    recipe: Recipe,
    gate_ids: Sequence[int],
    calibration: Sequence[int],
    selection: dict[str, list[int]] | None = None,
) -> tuple[LastTokenLogits, Reference, dict[str, Any]]:
    """The exported module for a recipe with ``quantization.gptq``, the eager fp32 logits on
    ``gate_ids`` and the record of the tuning for the manifest. ``selection``: the escalation's
    texts by name, as token ids (needed where the recipe escalates)."""
    quant = recipe.quantization
    settings, base = quant.gptq, quant.linear
    assert settings is not None and base is not None  # the recipe checks gptq comes with 8da4w
    escalation = settings.escalate
    dtype = DTYPES[recipe.export.dtype]
    windows = calibration_windows(calibration, settings, Path(recipe.name))
    start = time.perf_counter()
    longest = max(recipe.export.max_seq_len, settings.window_tokens)
    select: dict[str, list[list[int]]] = {}
    if escalation is not None:
        assert selection is not None, "the escalation needs its selection texts"
        length, tokens = escalation.window_tokens, escalation.tokens
        select = {k: windows_of(v, length, tokens) for k, v in selection.items()}
        longest = max(longest, escalation.window_tokens)
    with torch.device("meta"):
        model = Transformer(ckpt.args, longest)
    source = TensorSource(ckpt, model)
    model.init_buffers()
    gate = torch.tensor([list(gate_ids)])
    blocks: list[dict[str, Any]] = []
    ladders: list[Ladder] = []
    with torch.no_grad(), fixed_threads(settings.threads), tempfile.TemporaryDirectory() as spill:
        fill(model.tok_embeddings, source, "tok_embeddings.", None)
        selected = {  # the selection windows' fp32 rows, before the embedding is quantized
            k: [model.scale_embedding(model.tok_embeddings(torch.tensor([w])).float()) for w in ws]
            for k, ws in select.items()
        }
        h, xs, from_fp32, from_quantized = embed(model, recipe, gate, windows)
        release_memory()  # the embedding's fp32 rows, quantized in place
        gate_rope = model.rope_window(0, gate.shape[1])
        rope = model.rope_window(0, settings.window_tokens)
        with progress("gptq", total=len(model.layers), unit="block") as tick:
            for i, layer in enumerate(model.layers):
                assert isinstance(layer, TransformerBlock)
                fill(layer, source, f"layers.{i}.")
                h = layer(h, gate_rope, 0)
                selected = {
                    k: [layer(x, model.rope_window(0, x.shape[1]), 0) for x in v] for k, v in selected.items()
                }
                from_fp32 = [layer(e, rope, 0) for e in from_fp32]
                from_quantized = [layer(e, rope, 0) for e in from_quantized]
                xs, record = tune_block(layer, xs, rope, settings, base, dtype)
                ladders.append(ladder(block_linears(layer), record, Path(spill) / str(i), base))
                blocks.append(record)
                # glibc keeps a block's freed transients (fp32 weights, Hessians, the solve's copies)
                # mapped and the next block's rarely fit the holes: without this the tuning's RSS
                # only grew, and Qwen2.5-0.5B's tuning peaked at 3.5-3.8 GB, with it 2.1 GB
                # (docs/quality.md)
                release_memory()
                tick()
        fill(model.norm, source, "norm.")
        h = model.norm(h)
        xs = [model.norm(x) for x in xs]
        from_fp32, from_quantized = (
            [model.norm(e) for e in from_fp32],
            [model.norm(e) for e in from_quantized],
        )
        fill(model.output, source, "output.", None)
        head = model.output.weight
        logits = model.finish_logits(head_logits(h, head))[0, :-1]
        reference = {
            k: [fp32_nll(model, head, x, w) for x, w in zip(selected[k], select[k], strict=True)]
            for k in select
        }
        del selected
        model.norm.to(dtype)

        hessian = sum(
            (x.reshape(-1, x.shape[-1]).T @ x.reshape(-1, x.shape[-1]) for x in xs),
            torch.zeros(head.shape[1], head.shape[1]),
        )
        embedded = (from_fp32, from_quantized)
        release_memory()
        solved, vocab, ranking = vocabulary_precision(
            model, source, recipe, head, hessian, embedded, xs, rank_rows=escalation is not None
        )
        model.output.weight = nn.Parameter(solved, requires_grad=False)
        escalated = None
        if escalation is not None:
            del xs, embedded, from_fp32, from_quantized
            release_memory()
            linears = [block_linears(layer) for layer in model.layers]
            all4, now = weight_bytes(model, linears, blocks, vocab, base)
            rows = None if ranking is None else HeadRows(model, head, hessian, ranking, settings, base, dtype)
            target = settings.int8_error_target or max(b["chosen"] for b in blocks)
            ratios = selection_measure(model, {k: (select[k], reference[k]) for k in select})
            head_steps = rows.steps if rows is not None else list
            escalated = escalate(escalation, ratios, ladders, head_steps, target, now, all4, loader(dtype))
            for steps, b in zip(ladders, blocks, strict=True):
                b["int8"] = sorted([*b["int8"], *(r.name for r in steps.raises[: steps.taken])])
            if rows is not None and rows.taken:
                vocab["head_int8_rows"] = rows.taken
                vocab["head_bits"] = 8 if rows.taken == rows.vocab else 4
    model.resize_cache(recipe.export.max_seq_len)
    model.cast_rope(dtype)
    seconds = time.perf_counter() - start
    record = tuning_record(settings, vocab, blocks, seconds, ckpt.args.parameter_count())
    if escalated is not None:
        record["escalation"] = escalated
    return for_export(recipe, model), Reference(list(gate_ids), logits), {"gptq": record}
