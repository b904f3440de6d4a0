"""Quality on texts of several kinds from sources no calibration text comes from, per kind.

Each text is scored in consecutive windows of the artifact's cache length (each from position 0)
up to ``tokens`` scored tokens, against fp32 logits streamed from the checkpoint a block at a time
(``reference.py``): a 3B model is never held whole. The perplexity ratio comes with a 95% interval
from a block bootstrap over runs of ``BOOTSTRAP_BLOCK`` consecutive tokens (neighbouring tokens are
not independent draws), so a reader sees whether a difference is larger than the text's own noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from backends import Stepper

from ..model.checkpoint import Checkpoint
from .reference import streamed_logits
from .steppers import score
from .validate import top2_margin

BOOTSTRAP_BLOCK = 32
BOOTSTRAP_SAMPLES = 2000
FIGURE_ROWS = 64


def token_figures(
    logits: torch.Tensor, reference: torch.Tensor, targets: torch.Tensor, clear_margin: float
) -> dict[str, torch.Tensor]:
    """Per scored token: both negative log-likelihoods, KL(fp32 || artifact), top-1 agreement, and
    whether fp32's own top-2 margin is clear. A few rows at a time: with a 150k vocabulary a
    window's log-softmaxes are 300 MB each."""
    rows = []
    for r in range(0, logits.shape[0], FIGURE_ROWS):
        lg, rf, tg = logits[r : r + FIGURE_ROWS], reference[r : r + FIGURE_ROWS], targets[r : r + FIGURE_ROWS]
        art, ref = F.log_softmax(lg.float(), -1), F.log_softmax(rf.float(), -1)
        rows.append(
            {
                "nll": -art.gather(1, tg[:, None])[:, 0],
                "nll_fp32": -ref.gather(1, tg[:, None])[:, 0],
                "kl": (ref.exp() * (ref - art)).sum(-1),
                "agree": (lg.argmax(-1) == rf.argmax(-1)).float(),
                "clear": top2_margin(rf) >= clear_margin,
            }
        )
    return {k: torch.cat([row[k] for row in rows]) for k in rows[0]}


def ratio_interval(nll: torch.Tensor, nll_fp32: torch.Tensor, seed: int = 0) -> tuple[float, float] | None:
    """95% block-bootstrap interval of exp(mean(nll - nll_fp32)), the perplexity ratio (None under
    two blocks of tokens)."""
    diff = (nll - nll_fp32).double()
    blocks = diff[: len(diff) // BOOTSTRAP_BLOCK * BOOTSTRAP_BLOCK].view(-1, BOOTSTRAP_BLOCK).mean(1)
    if len(blocks) < 2:
        return None
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(blocks), (BOOTSTRAP_SAMPLES, len(blocks)), generator=g)
    ratios = blocks[picks].mean(1).exp()
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return low, high


def windows_of(ids: Sequence[int], length: int, tokens: int) -> list[list[int]]:
    """Consecutive windows of at most ``length`` ids, each scoring ``length - 1`` tokens, covering
    the first ``tokens`` scored tokens."""
    ids = list(ids[: tokens + 1])
    out = [ids[s : s + length] for s in range(0, len(ids) - 1, length - 1)]
    return [w for w in out if len(w) >= 2]


def summary(parts: Sequence[Mapping[str, torch.Tensor]], windows: int) -> dict[str, Any]:
    f = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    interval = ratio_interval(f["nll"], f["nll_fp32"])
    clear = f["clear"]
    return {
        "tokens_scored": len(f["nll"]),
        "windows": windows,
        "artifact_perplexity": math.exp(float(f["nll"].mean())),
        "fp32_perplexity": math.exp(float(f["nll_fp32"].mean())),
        "perplexity_ratio": math.exp(float((f["nll"] - f["nll_fp32"]).mean())),
        "perplexity_ratio_interval": None if interval is None else list(interval),
        "top1_agreement": float(f["agree"].mean()),
        "top1_agreement_clear": float(f["agree"][clear].mean()) if bool(clear.any()) else None,
        "clear_positions": int(clear.sum()),
        "mean_kl": float(f["kl"].mean()),
    }


def judge(
    ckpt: Checkpoint,
    step: Stepper,
    texts: Mapping[str, Sequence[int]],
    length: int,
    tokens: int,
    clear_margin: float,
) -> dict[str, dict[str, Any]]:
    """Figures per text (by name) of ``step`` against the checkpoint's fp32, all texts' references
    from one streamed pass over the checkpoint."""
    windows = {name: windows_of(ids, length, tokens) for name, ids in texts.items()}
    flat = [(name, w) for name, ws in windows.items() for w in ws]
    parts: dict[str, list[dict[str, torch.Tensor]]] = {name: [] for name in texts}
    for (name, window), reference in zip(flat, streamed_logits(ckpt, [w for _, w in flat]), strict=True):
        parts[name].append(
            token_figures(score(step, window), reference, torch.tensor(window[1:]), clear_margin)
        )
    return {name: summary(parts[name], len(windows[name])) for name in texts if parts[name]}


def judged_failures(judged: Mapping[str, Mapping[str, Any]], limit: float | None) -> list[str]:
    """The judged texts whose perplexity ratio is over the recipe's ``limit`` (None: none is gated),
    each message naming the text and the key."""
    if limit is None:
        return []
    return [
        f"perplexity ratio to fp32 on {name} {f['perplexity_ratio']:.4f} ({f['tokens_scored']} tokens) > "
        f"validation.judge_max_perplexity_ratio {limit}"
        for name, f in judged.items()
        if not f["perplexity_ratio"] <= limit  # NaN fails too
    ]
