"""What the head costs at int4, alone: KL of the head on the int4 grid (round to nearest, and GPTQ
as the streamed tuning solves it) against the fp32 head, on the fp32 model's hidden states, per text.

    python -m tools.head_costs DIR [--tokens 1024]

The GPTQ head is solved with the recipe's ``android-arm64`` settings and the Hessian of the fp32
model's final hidden states on its calibration windows (the build uses the quantized model's:
this isolates the head). The texts: calibration-mixed (other packages' prose and code besides
CPython's) and the judged texts. What it answers: is a model's head a different kind of tensor from
another's, or only more sensitive (docs/families.md)?
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from exporter.gate.inputs import TEXTS
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.model.tokenizer import load_tokenizer, tokenizer_info
from exporter.quant.sequential import calibration_windows
from exporter.quant.tune import calibration_ids
from exporter.quant.vocabulary import solve_head
from exporter.recipe import load_recipe
from tools.part_costs import round_to_grid

TEXT_NAMES = ("calibration-mixed", "other-prose", "other-code")
WINDOW = 512


def head_kl(
    hidden: torch.Tensor,
    reference: torch.Tensor,
    candidate: torch.Tensor,
    finish: Callable[[torch.Tensor], torch.Tensor],
) -> float:
    """Summed KL(softmax(finish(h W^T)) || softmax(finish(h C^T))) over the rows of ``hidden``."""
    p = torch.log_softmax(finish(hidden @ reference.T), -1)
    q = torch.log_softmax(finish(hidden @ candidate.T), -1)
    return float((p.exp() * (p - q)).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--tokens", type=int, default=1024)
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    ckpt = open_checkpoint(a.checkpoint)
    tok = load_tokenizer(ckpt.tokenizer_path)
    info = tokenizer_info(ckpt.path, ckpt.config, tok)
    bos = [info.bos_id] if info.add_bos and info.bos_id is not None else []  # Gemma needs its BOS
    recipe = load_recipe("android-arm64", ())
    settings, grid = recipe.quantization.gptq, recipe.quantization.linear
    assert settings is not None and grid is not None
    model = load_model(ckpt, WINDOW)
    head = model.output.weight.detach().clone()
    hidden: dict[str, torch.Tensor] = {}
    model.output.register_forward_pre_hook(lambda _m, args: hidden.__setitem__("x", args[0][0].float()))

    def run(ids: list[int]) -> torch.Tensor:
        model.reset_cache()
        model(torch.tensor([ids]), torch.tensor([0]))
        return hidden["x"]

    calibration, _ = calibration_ids(settings.text, tok, info, Path(recipe.name))
    hessian = torch.zeros(head.shape[1], head.shape[1])
    for w in calibration_windows(calibration, settings, Path(recipe.name)):
        x = run(w)
        hessian.addmm_(x.T, x)
    candidates = {
        "round to nearest": round_to_grid(head.float()),
        "GPTQ": solve_head(head, hessian, grid, settings).dequantize(),
    }
    print(f"{ckpt.name}: head int4 KL vs fp32 (nats/token), {a.tokens} tokens a text")
    for name in TEXT_NAMES:
        text = (TEXTS / f"{name}.txt").read_text()
        ids = bos + tok.encode(text[len(text) // 3 :], add_special_tokens=False).ids  # past the headers
        totals = dict.fromkeys(candidates, 0.0)
        for start in range(0, a.tokens, WINDOW):
            x = run(ids[start : start + WINDOW])
            for k, c in candidates.items():
                totals[k] += head_kl(x, head.float(), c, model.finish_logits)
        print(f"{name}: " + ", ".join(f"{k} {v / a.tokens:.4f}" for k, v in totals.items()))


if __name__ == "__main__":
    main()
