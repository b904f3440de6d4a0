"""The vocabulary's two tensors in the streamed tuning: the embedding and the head, each at 4 or 8
bits by its measured cost, the head solved by GPTQ a block of rows at a time.

A large vocabulary's tensors are a model's largest (Gemma 3 270M's tied 262,144 x 640 is 168 M of
its 268 M parameters), so nothing here holds a [positions, vocabulary] tensor or an fp32 copy of
the head: logits come a block of ``HEAD_ROWS`` entries at a time and KL gathers the softmax
normalisers over the blocks first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..gate.reference import HEAD_ROWS
from ..model.checkpoint import TensorSource, fill
from ..model.transformer import Transformer
from ..plumbing.memory import release_memory
from ..recipe import LinearQuant, Recipe, StreamedGptq
from .configs import quantize_embedding
from .gptq import INT8, Quantized, prepare, solve, to_torchao
from .stream import DTYPES


def solve_head(
    head: torch.Tensor, hessian: torch.Tensor, q: LinearQuant, settings: StreamedGptq
) -> Quantized:
    """The head (as stored, e.g. bf16) solved ``HEAD_ROWS`` rows at a time (rows are independent
    given the Hessian; the block is the one its fp32 logits are cast in)."""
    prepared = prepare(hessian, settings.damp, settings.act_order)
    whole: Quantized | None = None  # written in place: joining the parts was a second copy
    for r in range(0, head.shape[0], HEAD_ROWS):
        part = solve(
            head[r : r + HEAD_ROWS].float(), hessian, q, prepared=prepared, clip_search=settings.clip_search
        )
        if whole is None:
            rows = head.shape[0]
            whole = Quantized(
                torch.empty(rows, part.codes.shape[1], dtype=part.codes.dtype),
                torch.empty(rows, part.scales.shape[1], dtype=part.scales.dtype),
                part.group_size,
            )
        whole.codes[r : r + HEAD_ROWS], whole.scales[r : r + HEAD_ROWS] = part.codes, part.scales
    assert whole is not None  # a head has rows
    return whole


LogitBlocks = Callable[[torch.Tensor], Iterator[torch.Tensor]]


def head_blocks(
    rows: Callable[[int, int], torch.Tensor], vocab: int, finish: Callable[[torch.Tensor], torch.Tensor]
) -> LogitBlocks:
    """Logits of hidden states [N, E] a block of ``HEAD_ROWS`` vocabulary entries at a time, from
    ``rows(start, stop)``, the head's fp32 rows: no [N, V] tensor and no fp32 copy of the head."""

    def blocks(x: torch.Tensor) -> Iterator[torch.Tensor]:
        for r in range(0, vocab, HEAD_ROWS):
            yield finish(F.linear(x, rows(r, min(r + HEAD_ROWS, vocab))))

    return blocks


def mean_kl(
    reference: LogitBlocks,
    candidate: LogitBlocks,
    reference_inputs: Sequence[torch.Tensor],
    candidate_inputs: Sequence[torch.Tensor],
) -> float:
    """Mean KL(reference || candidate) per position over the windows, the softmax normalisers
    gathered over vocabulary blocks first (a 262k-vocabulary's log-softmax is 1 MB per position)."""
    total, count = 0.0, 0
    for x, y in zip(reference_inputs, candidate_inputs, strict=True):
        x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
        norm_p = torch.stack([b.logsumexp(-1) for b in reference(x)]).logsumexp(0)[:, None]
        norm_q = torch.stack([b.logsumexp(-1) for b in candidate(y)]).logsumexp(0)[:, None]
        for p, q in zip(reference(x), candidate(y), strict=True):
            p, q = p - norm_p, q - norm_q
            total += float((p.exp() * (p - q)).sum())
        count += x.shape[0]
    return total / count


def row_costs(reference: LogitBlocks, candidate: LogitBlocks, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each vocabulary entry's share [V] of what ``candidate`` costs against ``reference`` on the
    hidden states ``inputs``: the sum over positions of p * d^2, p the reference's probability of
    the entry and d the error of its logit. KL is about half the p-weighted variance of the logit
    errors, so the rows that cost are those whose error meets probability (ranked by it, a head's
    costliest rows at 8 bits recover more per row than ranked by probability or by id, on the three
    real models: docs/quality.md)."""
    total: torch.Tensor | None = None
    for x in inputs:
        x = x.reshape(-1, x.shape[-1])
        norm = torch.stack([b.logsumexp(-1) for b in reference(x)]).logsumexp(0)[:, None]
        pairs = zip(reference(x), candidate(x), strict=True)
        costs = torch.cat([((p - norm).exp() * (q - p) ** 2).sum(0) for p, q in pairs])
        total = costs if total is None else total + costs
    assert total is not None  # at least one window
    return total


def _over(kl: float, budget: float | None, bits: int) -> bool:
    """A 4-bit tensor whose measured cost is over the recipe's budget goes 8-bit."""
    return budget is not None and bits == 4 and kl > budget


def vocabulary_precision(
    model: Transformer,
    source: TensorSource,
    recipe: Recipe,
    head: torch.Tensor,
    hessian: torch.Tensor,
    embedded: tuple[list[torch.Tensor], list[torch.Tensor]],
    hidden: list[torch.Tensor],
    rank_rows: bool = False,
) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor | None]:
    """The solved head, and embedding and head at 4 or 8 bits by their measured cost: ``embedded``
    is the final hidden states of the probe windows from fp32 and from quantized embedding rows
    (through fp32 blocks), ``hidden`` the quantized model's on the calibration windows. With
    ``rank_rows``, a 4-bit head's rows costliest first (``row_costs`` on the probe windows)."""
    quant, settings = recipe.quantization, recipe.quantization.gptq
    assert settings is not None and quant.linear is not None
    dtype = DTYPES[recipe.export.dtype]

    fp32 = head_blocks(lambda a, b: head[a:b].float(), head.shape[0], model.finish_logits)
    record: dict[str, Any] = {"embedding_kl": mean_kl(fp32, fp32, *embedded)}
    record["embedding_bits"] = None if quant.embedding is None else quant.embedding.bits
    if quant.embedding is not None and _over(
        record["embedding_kl"], settings.embedding_max_kl, quant.embedding.bits
    ):
        fill(model.tok_embeddings, source, "tok_embeddings.", None)
        quantize_embedding(model.tok_embeddings, dataclasses.replace(quant.embedding, bits=8), dtype)
        record["embedding_bits"] = 8
    probe = hidden[: settings.measure_windows]
    grid = INT8 if settings.head_bits == 8 else quant.linear
    release_memory()  # the embedding's fp32 rows and its measure's transients
    solved = solve_head(head, hessian, grid, settings)
    record["head_bits"] = settings.head_bits
    record["head_kl"] = mean_kl(fp32, _solved_blocks(model, solved), probe, probe)
    if _over(record["head_kl"], settings.head_max_kl, settings.head_bits):
        grid = INT8
        solved = solve_head(head, hessian, grid, settings)
        record["head_bits"] = 8
        record["head_kl_int8"] = mean_kl(fp32, _solved_blocks(model, solved), probe, probe)
    ranking = None
    if rank_rows and record["head_bits"] == 4:
        ranking = row_costs(fp32, _solved_blocks(model, solved), probe).argsort(descending=True, stable=True)
    rounded = {k: round(v, 6) if isinstance(v, float) else v for k, v in record.items()}
    return to_torchao(solved, grid, dtype), rounded, ranking


def _solved_blocks(model: Transformer, solved: Quantized) -> LogitBlocks:
    """The solved head's weight error alone (no activation rounding): its rows dequantized a block
    at a time."""

    def rows(a: int, b: int) -> torch.Tensor:
        return Quantized(solved.codes[a:b], solved.scales[a:b], solved.group_size).dequantize()

    return head_blocks(rows, solved.codes.shape[0], model.finish_logits)


def embed(
    model: Transformer, recipe: Recipe, gate: torch.Tensor, windows: list[list[int]]
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The gate's and the calibration windows' embeddings, and the probe windows' from fp32 rows and
    from quantized rows (the embedding's own cost: measured, not assumed; it is the largest tensor
    of a large-vocabulary model). Quantizes the (fp32) embedding in place on the way."""
    settings, dtype = recipe.quantization.gptq, DTYPES[recipe.export.dtype]
    assert settings is not None

    def rows(ids: torch.Tensor) -> torch.Tensor:
        return model.scale_embedding(model.tok_embeddings(ids).float())

    h = rows(gate)
    xs = [rows(torch.tensor([w])) for w in windows]
    probe = [torch.tensor([w]) for w in windows[: settings.measure_windows]]
    from_fp32 = [rows(p) for p in probe]
    quantize_embedding(model.tok_embeddings, recipe.quantization.embedding, dtype)
    return h, xs, from_fp32, [rows(p) for p in probe]
