"""GPTQ onto the XNNPACK grids, solved on the CPU: the one place where we write quantization math.

Why ours: torchao 0.18's ``prototype.gptq`` targets Int4WeightOnly / Int8WeightOnly / NVFP4 only and
its solve asserts CUDA; our target is the 8da4w grid XNNPACK runs (symmetric int4, groups of 32,
bf16 scales) and 8da8w (symmetric int8, one fp32 scale per output channel). The solve is
Frantar et al.'s (arXiv 2210.17323, Algorithm 1 with lazy batch updates and groups): columns are
quantized left to right and each column's rounding error, weighted by the inverse Hessian of the
layer's inputs, is pushed onto the columns not yet quantized.

What comes out are codes and scales on exactly the grid torchao's affine algorithm uses (scale =
max |w| / ((qmax - qmin) / 2) narrowed to the stored dtype, then round(w * (1 / scale)) half to
even, clamped), and ``to_torchao`` wraps them in torchao's ``IntxUnpackedToInt8Tensor`` with the
fields the 8da configs set, so export and lowering see the tensor an untuned build makes, other
codes only.
With an identity Hessian the solve is round-to-nearest and equals torchao's output
(``tests/quant/test_gptq.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..recipe import LinearQuant

# (qmin, qmax) of the target grids
BOUNDS = {"8da4w": (-8, 7), "8da8w": (-128, 127)}
# int8 per output channel: the grid a linear is raised to
INT8 = LinearQuant(scheme="8da8w", group_size=0)


@dataclass(frozen=True)
class Quantized:
    """A linear weight on the target grid: ``codes`` [out, in] int8, ``scales`` [out, in / group]."""

    codes: torch.Tensor
    scales: torch.Tensor
    group_size: int

    def dequantize(self) -> torch.Tensor:
        return (
            self.codes.float().view(self.codes.shape[0], -1, self.group_size) * self.scales.float()[..., None]
        ).flatten(1)


# Shrink factors of the absolute-maximum scale tried by the clipping search: clipping a group's
# few largest weights buys a finer grid for all the others.
CLIP_GRID = tuple(1.0 - 0.025 * i for i in range(13))  # 1.0 .. 0.7


def _scales(w: torch.Tensor, q: LinearQuant, search: bool = False) -> torch.Tensor:
    """Scales of the groups of ``w`` [out, group] in the dtype the .pte stores (bf16 for groups,
    fp32 per channel): torchao's symmetric affine choice (absolute maximum), or with ``search`` the
    shrink of it from ``CLIP_GRID`` that leaves the least rounding error of the weights themselves
    per group. Every input counts alike: weighting the error by the calibration inputs' energy (the
    Hessian's diagonal) was measured too, and fits the calibration text: on text from other
    sources it lost to the plain search on SmolLM2-135M and Qwen2.5-Coder-0.5B (docs/quality.md)."""
    qmin, qmax = BOUNDS[q.scheme]
    absmax = w.abs().amax(dim=1) / ((qmax - qmin) / 2)

    def narrowed(factor: float) -> torch.Tensor:
        scale = (absmax * factor).clamp(min=torch.finfo(torch.float32).smallest_normal)
        return scale.to(torch.bfloat16) if q.scheme == "8da4w" else scale

    if not search:
        return narrowed(1.0)
    best, best_err = narrowed(1.0), torch.full_like(absmax, torch.inf)
    for factor in CLIP_GRID:
        scale = narrowed(factor)
        err = (w - _round(w, scale[:, None], q) * scale.float()[:, None]).square().sum(1)
        better = err < best_err
        best, best_err = torch.where(better, scale, best), torch.where(better, err, best_err)
    return best


def _round(w: torch.Tensor, scale: torch.Tensor, q: LinearQuant) -> torch.Tensor:
    """torchao's rounding to the grid: the reciprocal is taken in the scale's own dtype (bf16 for
    8da4w), as ``quantize_affine`` does after the config narrows the scales."""
    qmin, qmax = BOUNDS[q.scheme]
    return torch.clamp(torch.round(w * (1.0 / scale)), qmin, qmax)


def inverse_hessian_factor(
    hessian: torch.Tensor, damp: float, release: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The upper Cholesky factor of H^-1 (dampened by ``damp`` times H's mean diagonal) and the mask
    of dead inputs (never nonzero on the calibration text: their weights do not matter).
    ``release``: ``hessian`` is a copy of the caller's, emptied here once read."""
    # Memory: a 8192-wide input (a 1B model's down projection) is 537 MB per float64 copy; each step
    # below frees its input before the next, and the dampening goes onto the diagonal in place (an
    # identity matrix the size of H was one more copy): at most two copies are alive at a time.
    h = hessian.to(torch.float64, copy=True)
    if release:  # drop its storage now: the caller keeps no other reference to this copy
        hessian.set_(torch.empty(0, dtype=hessian.dtype).untyped_storage())
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    diagonal = h.diagonal()
    diagonal += damp * torch.mean(diagonal)
    for attempt in range(5):
        factor, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0:
            break
        # ill-conditioned on a short text: dampen more (GPTQ's own remedy)
        diagonal += (10**attempt) * damp * torch.mean(diagonal)
    del h, diagonal
    inverse = torch.cholesky_inverse(factor)
    del factor
    return torch.linalg.cholesky(inverse, upper=True).float(), dead


@dataclass(frozen=True)
class Prepared:
    """What a Hessian gives every weight solved with it: the column order, the permuted Hessian's
    inverse factor and dead inputs (in that order)."""

    order: torch.Tensor
    hinv: torch.Tensor
    dead: torch.Tensor


def prepare(hessian: torch.Tensor, damp: float, act_order: bool) -> Prepared:
    """Factor a Hessian once for all the weights that read the same input (q/k/v, gate/up; int4
    and int8 alike): the Cholesky work is cubic in the input width."""
    order = (
        torch.argsort(torch.diag(hessian), descending=True) if act_order else torch.arange(hessian.shape[0])
    )
    permuted = hessian[order[:, None], order[None, :]] if act_order else hessian  # one copy, not two
    hinv, dead = inverse_hessian_factor(permuted, damp, release=act_order)
    return Prepared(order, hinv, dead)


def solve(
    weight: torch.Tensor,
    hessian: torch.Tensor | None,
    q: LinearQuant,
    damp: float = 0.01,
    block: int = 128,
    prepared: Prepared | None = None,
    act_order: bool = False,
    clip_search: bool = False,
) -> Quantized:
    """GPTQ of ``weight`` [out, in] with input Hessian ``hessian`` [in, in] (sum of x x^T) onto the
    grid of ``q`` (8da4w groups or 8da8w per channel).

    ``prepared``: ``prepare``'s result for this Hessian, when several weights share it (its column
    order then stands for ``act_order``). ``act_order``: columns in order of decreasing Hessian
    diagonal (the inputs with most energy first), every group's scale fixed from the weight before
    the solve ("static groups"), so the grid stays the one XNNPACK reads. ``clip_search``: each
    group's scale is the shrink of its absolute maximum that rounds the weights with the least error
    (``_scales``)."""
    w = weight.detach().float().clone()
    rows, cols = w.shape
    group = cols if q.scheme == "8da8w" else q.group_size
    assert cols % group == 0 and (group == cols or block % group == 0), (cols, group, block)
    if prepared is None:
        assert hessian is not None, "solve needs the Hessian or its prepared factor"
        prepared = prepare(hessian, damp, act_order)
    order, hinv, dead = prepared.order, prepared.hinv, prepared.dead
    static = not torch.equal(order, torch.arange(cols)) or group == cols  # scales fixed before the solve
    scales = torch.zeros(rows, cols // group, dtype=torch.bfloat16 if q.scheme == "8da4w" else torch.float32)
    if static:
        w[:, order[dead]] = 0
        for g in range(cols // group):
            scales[:, g] = _scales(w[:, g * group : (g + 1) * group], q, clip_search)
    w = w[:, order]
    w[:, dead] = 0
    codes = torch.zeros_like(w)
    for start in range(0, cols, block):
        end = min(start + block, cols)
        w1, err1, h1 = w[:, start:end].clone(), torch.zeros(rows, end - start), hinv[start:end, start:end]
        for i in range(end - start):
            col = start + i
            if not static and col % group == 0:
                scales[:, col // group] = _scales(w1[:, i : i + group], q, clip_search)
            scale = scales[:, int(order[col]) // group]
            c = _round(w1[:, i], scale, q)
            codes[:, col] = c
            err = (w1[:, i] - c * scale.float()) / h1[i, i]
            w1[:, i:] -= err[:, None] * h1[i, i:][None, :]
            err1[:, i] = err
        w[:, end:] -= err1 @ hinv[start:end, end:]
    restored = torch.empty_like(codes)
    restored[:, order] = codes
    return Quantized(restored.to(torch.int8), scales, group)


def proxy_loss(weight: torch.Tensor, quantized: torch.Tensor, hessian: torch.Tensor) -> float:
    """sum over calibration inputs x of |(W - Q) x|^2: the layer's output error on that text."""
    delta = weight.float() - quantized.float()
    return float(torch.einsum("oi,ij,oj->", delta, hessian, delta))


def to_torchao(quantized: Quantized, q: LinearQuant, dtype: torch.dtype) -> torch.Tensor:
    """The weight tensor the 8da config would make, with our codes and scales (zero points 0, int8
    per-token asymmetric activations, logical dtype ``dtype``)."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    target = torch.int4 if q.scheme == "8da4w" else torch.int8  # type: ignore[attr-defined]
    return IntxUnpackedToInt8Tensor(
        quantized.codes,
        quantized.scales,
        torch.zeros_like(quantized.scales, dtype=torch.int8),
        target,
        (1, quantized.group_size),
        dtype,
        "int8_asym_per_token",
    )
