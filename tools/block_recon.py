"""Block-wise reconstruction after streamed GPTQ, measured: does training each block's scales against
its fp32 output (BRECQ / EfficientQAT's Block-AP, scales only) help on text from other sources?

    python -m tools.block_recon DIR [--steps 28] [--lr 1e-3] [--norms] [--loss mse|relative]
                                    [--target quantized|fp32] [--set KEY=VALUE ...]

The recipe's streamed GPTQ (``android-arm64`` with ``--set`` overrides) runs as a build runs it; after
each block is solved, ``--steps`` Adam steps (4 calibration windows each) train a log-offset of every
group's scale (codes fixed, scales narrowed back to bf16 after) and with ``--norms`` the block's norm
weights, minimising the block's output error against the fp32 block on the same (quantized-path)
inputs, or with ``--target fp32`` against the fp32 model's own activations (earlier blocks' errors
corrected too). The first 4 windows are held out: the step with the least error on them is kept.
Prints the eager quantized model's perplexity ratio to fp32 on other-prose / other-code (1,024
tokens, two windows of 512). An experiment, not a recipe option: docs/quality.md has its figures.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from exporter.gate.inputs import TEXTS
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.model.tokenizer import load_tokenizer, tokenizer_info
from exporter.model.transformer import Rope, Transformer, TransformerBlock
from exporter.quant import sequential
from exporter.quant.gptq import Quantized
from exporter.quant.tune import calibration_ids, selection_ids
from exporter.recipe import LinearQuant, StreamedGptq, load_recipe

KINDS = ("other-prose", "other-code")
HELD_OUT = 4  # calibration windows kept out of training, to pick the step


def _error(block: TransformerBlock, xs: list[torch.Tensor], ys: list[torch.Tensor], rope: Rope) -> float:
    with torch.no_grad():
        return sum(float((block(x, rope, 0) - y).square().sum()) for x, y in zip(xs, ys, strict=True))


def reconstruct(
    block: TransformerBlock,
    solved: dict[str, Quantized],
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    rope: Rope,
    steps: int,
    lr: float,
    norms: bool = False,
    relative: bool = False,
) -> tuple[dict[str, Quantized], tuple[float, float]]:
    """``solved`` with trained scales (and the block's norms trained in place when ``norms``), and
    the held-out error before and after."""
    linears = sequential.block_linears(block)
    offsets = {n: torch.zeros(q.scales.shape, requires_grad=True) for n, q in solved.items()}
    codes = {n: q.codes.float().view(q.codes.shape[0], -1, q.group_size) for n, q in solved.items()}
    norm_weights = [p for n, p in block.named_parameters() if "norm" in n] if norms else []
    for p in norm_weights:
        p.requires_grad_(True)
    opt = torch.optim.Adam(
        [{"params": list(offsets.values()), "lr": lr}, {"params": norm_weights, "lr": lr / 10}]
    )

    def set_weights() -> None:
        for n, m in linears.items():
            scales = solved[n].scales.float() * offsets[n].exp()
            del m.weight  # a computed tensor in the parameter's place, so gradients reach the offsets
            m.weight = (codes[n] * scales[..., None]).flatten(1)  # type: ignore[assignment]

    def snapshot() -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        return {n: t.detach().clone() for n, t in offsets.items()}, [p.detach().clone() for p in norm_weights]

    held_x, held_y, train = xs[:HELD_OUT], ys[:HELD_OUT], list(range(HELD_OUT, len(xs)))
    set_weights()
    start = _error(block, held_x, held_y, rope)
    best, kept = start, snapshot()
    order = torch.Generator().manual_seed(0)
    batch, per_epoch = 4, max(1, len(train) // 4)
    for step in range(steps):
        if step % per_epoch == 0:
            shuffled = [train[i] for i in torch.randperm(len(train), generator=order)]
        opt.zero_grad()
        for i in shuffled[(step % per_epoch) * batch :][:batch]:
            with torch.enable_grad():
                set_weights()
                d = (block(xs[i], rope, 0) - ys[i]).square()
                if relative:  # per token, relative to its energy; the first token (a sink) dropped
                    d = (d / ys[i].square().mean(-1, keepdim=True))[:, 1:]
                (d.mean() / batch).backward()
            cache = block.attention.kv_cache
            cache.k_cache, cache.v_cache = cache.k_cache.detach(), cache.v_cache.detach()
        opt.step()
        if (step + 1) % per_epoch == 0 or step + 1 == steps:  # held-out error once per epoch
            set_weights()
            error = _error(block, held_x, held_y, rope)
            if error < best:
                best, kept = error, snapshot()
    for p, v in zip(norm_weights, kept[1], strict=True):
        p.requires_grad_(False)
        p.data = v
    out = {
        n: Quantized(q.codes, (q.scales.float() * kept[0][n].exp()).to(q.scales.dtype), q.group_size)
        for n, q in solved.items()
    }
    for n, m in linears.items():
        m.weight = nn.Parameter(out[n].dequantize(), requires_grad=False)
    return out, (start, best)


def reconstructing(args: argparse.Namespace) -> Callable[..., tuple[list[torch.Tensor], dict[str, Any]]]:
    """A ``tune_block`` that reconstructs between the solve and the torchao tensors."""
    fp32_path: list[torch.Tensor] = []

    def tune_block(
        block: TransformerBlock,
        xs: list[torch.Tensor],
        rope: Rope,
        settings: StreamedGptq,
        base: LinearQuant,
        dtype: torch.dtype,
    ) -> tuple[list[torch.Tensor], dict[str, Any]]:
        with torch.no_grad():
            if args.target == "fp32":
                fp32_path[:] = [block(x, rope, 0) for x in (fp32_path or xs)]
                targets = list(fp32_path)
            else:
                targets = [block(x, rope, 0) for x in xs]
        solved = sequential.solve_block(block, xs, rope, settings, base)
        if args.steps:
            t = time.perf_counter()
            weights, (before, after) = reconstruct(
                block,
                solved.weights,
                xs,
                targets,
                rope,
                args.steps,
                args.lr,
                args.norms,
                args.loss == "relative",
            )
            solved = sequential.SolvedBlock(weights, solved.int8, solved.errors)
            print(f"held-out error {before:.4g} -> {after:.4g} ({time.perf_counter() - t:.1f} s)", flush=True)
        return sequential.finish_block(block, xs, rope, solved, base, dtype)

    return tune_block


def perplexity(model: Transformer, ids: list[int]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for a in range(0, len(ids), 512):
            x = torch.tensor([ids[a : a + 512]])
            model.reset_cache()
            logp = torch.log_softmax(model(x, torch.tensor([0]))[0, :-1].float(), -1)
            total -= logp.gather(1, x[0, 1:, None]).sum().item()
            count += x.shape[1] - 1
    return math.exp(total / count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--norms", action="store_true")
    ap.add_argument("--loss", choices=("mse", "relative"), default="mse")
    ap.add_argument("--target", choices=("quantized", "fp32"), default="quantized")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    a = ap.parse_args()
    ckpt = open_checkpoint(a.checkpoint)
    recipe = load_recipe("android-arm64", tuple(a.overrides))
    tok = load_tokenizer(ckpt.tokenizer_path)
    info = tokenizer_info(ckpt.path, ckpt.config, tok)
    name = recipe.calibration_text()
    assert name is not None
    calibration, _ = calibration_ids(name, tok, info, Path(recipe.name))
    bos = [info.bos_id] if info.add_bos and info.bos_id is not None else []  # Gemma needs its BOS
    texts = {
        k: (bos + tok.encode((TEXTS / f"{k}.txt").read_text(), add_special_tokens=False).ids)[:1024]
        for k in KINDS
    }
    reference = load_model(ckpt, 512)
    fp32 = {k: perplexity(reference, v) for k, v in texts.items()}
    del reference
    sequential.tune_block = reconstructing(a)  # type: ignore[assignment]
    start = time.perf_counter()
    selection = selection_ids(recipe, tok, info, Path(recipe.name))
    module = sequential.gptq_module(ckpt, recipe, [0, 0], calibration, selection)[0]
    seconds = time.perf_counter() - start
    model = module.model
    ratios = " / ".join(f"{perplexity(model, v) / fp32[k]:.4f}" for k, v in texts.items())
    print(f"{' / '.join(KINDS)}: {ratios}; tuning {seconds:.0f} s")


if __name__ == "__main__":
    main()
