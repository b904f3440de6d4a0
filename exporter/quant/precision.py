"""Mixed precision by measured sensitivity: which linears to raise above the recipe's precision.

Every linear starts at ``quantization.linear`` (e.g. 8da4w group 32). What its quantization costs
the model is estimated from the fp32 model itself, on calibration text: the diagonal Fisher
information F of the weights (squared gradients of the log-likelihood of tokens sampled from the
model's own next-token distributions, i.e. the curvature of KL(fp32 || quantized) at the fp32
weights) times the squared weight error each precision leaves, ``0.5 * sum(F * (W - Q(W))^2)``.
One backward pass per calibration window scores every linear at every precision; measuring each
linear's effect by a forward of the whole model instead took 10 minutes on a 135M model.

The plan raises, greedily, the linear whose next precision saves the most estimated KL per extra
byte, until the weights reach ``max_size_ratio`` times their size at the base precision. The
sequence of raises is then cut at the shortest prefix whose quantized model meets
``max_perplexity_ratio`` on calibration text, measured (a bisection over the prefix, a handful of
forwards): a model that needs no help gets none.

torchao does the quantizing (``quantize.quantize_linears``); nothing here computes a quantized value.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..model.transformer import Transformer
from ..recipe import LinearQuant, MixedPrecision
from .configs import dequantized, quantized_weight, stored_bytes_estimate

log = logging.getLogger("exporter")


@dataclass(frozen=True)
class Plan:
    """The precision of every linear (by module name) and how it was chosen."""

    precision: dict[str, LinearQuant]
    record: dict[str, Any]


def linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def windows(ids: Sequence[int], count: int, length: int, skip: int = 0) -> list[list[int]]:
    """``count`` consecutive windows of ``length`` tokens after the first ``skip`` windows."""
    out = [list(ids[(skip + i) * length : (skip + i + 1) * length]) for i in range(count)]
    return [w for w in out if len(w) == length]


def fisher_diagonal(model: Transformer, texts: Sequence[Sequence[int]], seed: int) -> dict[str, torch.Tensor]:
    """Per linear weight, the sum over ``texts`` of the squared gradient of the log-likelihood of
    tokens drawn from the model's own predictions (the empirical Fisher with sampled labels)."""
    weights = {n: m.weight for n, m in linears(model).items()}
    frozen = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    fisher = {n: torch.zeros_like(w, dtype=torch.float32) for n, w in weights.items()}
    generator = torch.Generator().manual_seed(seed)
    try:
        for w in weights.values():
            w.requires_grad_(True)
        for ids in texts:
            model.init_buffers()  # the KV cache is written in place; autograd needs fresh buffers
            logits = model(torch.tensor([list(ids)]), torch.tensor([0]))[0].float()
            with torch.no_grad():
                labels = torch.multinomial(F.softmax(logits, -1), 1, generator=generator)[:, 0]
            loss = F.cross_entropy(logits, labels, reduction="sum")
            grads = torch.autograd.grad(loss, list(weights.values()))
            for name, g in zip(weights, grads, strict=True):
                fisher[name] += g.float().square()
    finally:
        for p, flag in frozen.items():
            p.requires_grad_(flag)
        model.init_buffers()
    return fisher


def raise_order(
    errors: Mapping[str, Mapping[LinearQuant, float]],
    sizes: Mapping[str, Mapping[LinearQuant, float]],
    base: LinearQuant,
    byte_budget: float,
) -> list[tuple[str, LinearQuant]]:
    """Greedy: repeatedly move the linear whose next precision saves the most estimated error per
    extra byte, within ``byte_budget`` extra bytes. Returns the moves in order (a linear may move
    twice, e.g. to group 16 and later to 8-bit); ties break by name, so the order is stable."""
    current = dict.fromkeys(errors, base)
    spent, moves = 0.0, list[tuple[str, LinearQuant]]()
    while True:
        best: tuple[float, str, LinearQuant, float] | None = None
        for name in sorted(errors):
            now = current[name]
            for option, err in errors[name].items():
                extra = sizes[name][option] - sizes[name][now]
                gain = errors[name][now] - err
                if extra <= 0 or gain <= 0 or spent + extra > byte_budget:
                    continue
                if best is None or gain / extra > best[0]:
                    best = (gain / extra, name, option, extra)
        if best is None:
            return moves
        _, name, option, extra = best
        current[name] = option
        spent += extra
        moves.append((name, option))


def apply_moves(
    base: LinearQuant, names: Sequence[str], moves: Sequence[tuple[str, LinearQuant]]
) -> dict[str, LinearQuant]:
    plan = dict.fromkeys(names, base)
    for name, option in moves:
        plan[name] = option
    return plan


def perplexity_ratio(
    model: Transformer, texts: Sequence[Sequence[int]], fp32: Sequence[torch.Tensor]
) -> float:
    """exp(mean NLL of ``model`` - mean NLL of fp32) over the texts, teacher-forced."""
    gap = 0.0
    for ids, ref in zip(texts, fp32, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([list(ids)]), torch.tensor([0]))[0, :-1].float()
        model.reset_cache()
        target = torch.tensor(list(ids[1:]))
        gap += F.cross_entropy(logits, target).item() - F.cross_entropy(ref, target).item()
    return math.exp(gap / len(texts))


def choose_precisions(
    model: Transformer, base: LinearQuant, mixed: MixedPrecision, ids: Sequence[int]
) -> Plan:
    """The plan for ``model`` (fp32, untied) on calibration ``ids``; leaves the model fp32."""
    mods = linears(model)
    options = (base, *mixed.candidates)
    fisher_texts = windows(ids, mixed.windows, mixed.window_tokens)
    check_texts = windows(ids, mixed.windows, mixed.window_tokens, skip=mixed.windows)
    if len(check_texts) < mixed.windows:
        raise ValueError("calibration text too short for quantization.mixed.windows")
    fisher = fisher_diagonal(model, fisher_texts, mixed.seed)
    weights = {n: m.weight.detach().clone() for n, m in mods.items()}
    quantized = {n: {q: quantized_weight(weights[n], q) for q in options} for n in mods}
    errors = {
        n: {q: 0.5 * (fisher[n] * (dequantized(w) - weights[n]).square()).sum().item() for q, w in by.items()}
        for n, by in quantized.items()
    }
    sizes = {n: {q: stored_bytes_estimate(weights[n].shape, q) for q in options} for n in mods}
    base_bytes = sum(s[base] for s in sizes.values())
    moves = raise_order(errors, sizes, base, (mixed.max_size_ratio - 1) * base_bytes)
    with torch.no_grad():
        fp32 = [model(torch.tensor([t]), torch.tensor([0]))[0, :-1].float() for t in check_texts]
        model.reset_cache()

    def measured(count: int) -> float:
        plan = apply_moves(base, list(mods), moves[:count])
        for n, m in mods.items():
            m.weight = nn.Parameter(quantized[n][plan[n]], requires_grad=False)
        return perplexity_ratio(model, check_texts, fp32)

    checks = {0: measured(0)}
    lo, hi = 0, len(moves)
    if checks[0] > mixed.max_perplexity_ratio and moves:
        checks[hi] = measured(hi)
        while hi - lo > max(1, len(moves) // 32):  # a few forwards: to 1/32 of the moves
            mid = (lo + hi) // 2
            checks[mid] = measured(mid)
            lo, hi = (lo, mid) if checks[mid] <= mixed.max_perplexity_ratio else (mid, hi)
        if checks[hi] > mixed.max_perplexity_ratio:
            hi = len(moves)  # the budget does not reach the target: spend all of it
    else:
        hi = 0
    for n, m in mods.items():
        m.weight = nn.Parameter(weights[n], requires_grad=False)
    plan = apply_moves(base, list(mods), moves[:hi])
    chosen_bytes = sum(sizes[n][plan[n]] for n in mods)
    record = {
        "method": "diagonal Fisher x squared weight error, greedy per extra byte, cut at the measured target",
        "calibration_windows": [len(fisher_texts), mixed.window_tokens],
        "linear_weight_bytes_estimate": round(chosen_bytes),
        "size_ratio_to_base": round(chosen_bytes / base_bytes, 4),
        "raised": hi,
        "calibration_perplexity_ratio": {str(k): round(v, 4) for k, v in sorted(checks.items())},
    }
    log.info("[mixed] %d of %d linears raised, weights x%.3f", hi, len(mods), chosen_bytes / base_bytes)
    return Plan(plan, record)
