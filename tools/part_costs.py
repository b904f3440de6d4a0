"""What each part of a model costs at low precision, one part at a time, in eager fp32: perplexity
on the judged texts (other prose, other Python) with only that part fake-quantized, divided by fp32's.

    python -m tools.part_costs DIR [--tokens 1024]

Parts: the embedding lookup (int4 g32), the head (int4 g32), every block linear (int4 g32,
round-to-nearest: what GPTQ starts from) and int8 dynamic per-token activations of the block linears.
Round-to-nearest on absolute-maximum scales, as torchao's 8da4w grid is; no GPTQ.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from exporter.gate.inputs import TEXTS
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.model.tokenizer import load_tokenizer
from exporter.model.transformer import Transformer

KINDS = ("other-prose", "other-code")


def round_to_grid(w: torch.Tensor, bits: int = 4, group: int = 32) -> torch.Tensor:
    qmax = 2 ** (bits - 1) - 1
    g = w.reshape(-1, group)
    scale = (g.abs().amax(-1, keepdim=True) / qmax).clamp(min=1e-9)
    return ((g / scale).round().clamp(-qmax - 1, qmax) * scale).reshape(w.shape)


def int8_tokens(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Asymmetric int8 per token, as 8da's dynamic activation quantization."""
    x = args[0]
    lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 255).clamp(min=1e-9)
    zero = (-128 - lo / scale).round()
    return (((x / scale + zero).round().clamp(-128, 127) - zero) * scale,)


def perplexity(model: Transformer, ids: list[int]) -> float:
    x = torch.tensor([ids])
    with torch.no_grad():
        model.reset_cache()
        logp = torch.log_softmax(model(x, torch.tensor([0]))[0, :-1].float(), -1)
    return math.exp(-logp.gather(1, x[0, 1:, None]).mean().item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--tokens", type=int, default=1024)
    a = ap.parse_args()
    ckpt = open_checkpoint(a.checkpoint)
    tok = load_tokenizer(ckpt.tokenizer_path)
    bos = ckpt.config.get("bos_token_id") if ckpt.family.name == "gemma3" else None  # Gemma needs BOS
    texts = {
        k: ([bos] if bos is not None else [])
        + tok.encode((TEXTS / f"{k}.txt").read_text(), add_special_tokens=False).ids
        for k in KINDS
    }
    texts = {k: v[: a.tokens] for k, v in texts.items()}
    model = load_model(ckpt, a.tokens)
    model.output.weight = nn.Parameter(model.output.weight.detach().clone())  # untie: parts apart
    fp32 = {k: perplexity(model, v) for k, v in texts.items()}
    linears: list[nn.Linear] = [
        m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "output"
    ]

    def cost(name: str, change: Callable[[], Callable[[], None]]) -> None:
        undo = change()
        ratios = " / ".join(f"{perplexity(model, v) / fp32[k]:.4f}" for k, v in texts.items())
        undo()
        print(f"{name}: {ratios}")

    def weights(modules: list[nn.Linear] | list[nn.Embedding]) -> Callable[[], Callable[[], None]]:
        tensors: list[torch.Tensor] = [m.weight for m in modules]

        def change() -> Callable[[], None]:
            saved = [t.detach().clone() for t in tensors]
            with torch.no_grad():
                for t in tensors:
                    t.copy_(round_to_grid(t))

            def undo() -> None:
                with torch.no_grad():
                    for t, w in zip(tensors, saved, strict=True):
                        t.copy_(w)

            return undo

        return change

    def activations() -> Callable[[], None]:
        handles = [m.register_forward_pre_hook(int8_tokens) for m in linears]

        def undo() -> None:
            for h in handles:
                h.remove()

        return undo

    print(f"{ckpt.name}: perplexity / fp32 on {' / '.join(KINDS)}, {a.tokens} tokens")
    cost("embedding lookup int4 g32", weights([model.tok_embeddings]))
    cost("head int4 g32", weights([model.output]))
    cost("block linears int4 g32 (round to nearest)", weights(list(linears)))
    cost("int8 dynamic activations", activations)


if __name__ == "__main__":
    main()
