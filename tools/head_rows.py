"""How much of a 4-bit head's cost a few of its rows at 8 bits take back, by how the rows are chosen.

    python -m tools.head_rows DIR [--tokens 1024] [--sizes 1000,2000,4000,8000,16000]

Only the head is quantized (int4 g32 round to nearest, absolute-maximum scales; int8 per channel on
the chosen rows), on the fp32 model's final hidden states; perplexity on the judged texts (other
prose, other Python) over fp32's. Rows chosen three ways: the lowest ids (byte-level BPE vocabularies
number merges roughly by frequency), the highest mean fp32 probability on calibration text, and the
largest p * d^2 on calibration text (``exporter.quant.vocabulary.row_costs``: p the fp32
probability, d the 4-bit logit error), the measure the escalation ranks rows by.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from exporter.gate.inputs import TEXTS
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.model.tokenizer import load_tokenizer
from exporter.model.transformer import Transformer
from tools.part_costs import round_to_grid

KINDS = ("other-prose", "other-code")
CALIBRATION_WINDOWS, WINDOW, STRIDE = 8, 256, 4000  # spread over calibration.txt


def final_hidden(model: Transformer, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        model.reset_cache()
        return model.hidden(torch.tensor([ids]), torch.tensor([0]))[0].float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--sizes", default="1000,2000,4000,8000,16000")
    a = ap.parse_args()
    ckpt = open_checkpoint(a.checkpoint)
    tok = load_tokenizer(ckpt.tokenizer_path)
    bos = ckpt.config.get("bos_token_id") if ckpt.family.name == "gemma3" else None  # Gemma needs BOS
    first = [bos] if bos is not None else []

    def encode(name: str) -> list[int]:
        return tok.encode((TEXTS / f"{name}.txt").read_text(), add_special_tokens=False).ids

    texts = {k: (first + encode(k))[: a.tokens] for k in KINDS}
    cal = encode("calibration")
    windows = [first + cal[i * STRIDE : i * STRIDE + WINDOW - 1] for i in range(CALIBRATION_WINDOWS)]
    model = load_model(ckpt, max(a.tokens, WINDOW))
    head = model.output.weight.detach().float().clone()
    hidden = {k: final_hidden(model, v)[:-1] for k, v in texts.items()}
    targets = {k: torch.tensor(v[1:]) for k, v in texts.items()}
    calibration = torch.cat([final_hidden(model, w) for w in windows])
    four = round_to_grid(head, 4, 32)
    eight = round_to_grid(head, 8, head.shape[1])  # int8 per channel: one group per row
    finish = model.finish_logits
    with torch.no_grad():
        exact = finish(calibration @ head.T)
        p = torch.softmax(exact, -1)
        probability = p.mean(0)
        cost = (p * (finish(calibration @ four.T) - exact) ** 2).sum(0)
        del exact, p

    def nll(weight: torch.Tensor, kind: str) -> float:
        logits = finish(hidden[kind] @ weight.T)
        return -torch.log_softmax(logits, -1).gather(1, targets[kind][:, None]).mean().item()

    base = {k: nll(head, k) for k in KINDS}
    vocab = head.shape[0]
    ranks = {
        "lowest ids": torch.arange(vocab),
        "probability": probability.argsort(descending=True),
        "p * d^2": cost.argsort(descending=True),
    }
    print(f"head int4 alone: {' / '.join(f'{math.exp(nll(four, k) - base[k]):.4f}' for k in KINDS)}")
    print(f"head int8 alone: {' / '.join(f'{math.exp(nll(eight, k) - base[k]):.4f}' for k in KINDS)}")
    for rows in (int(s) for s in a.sizes.split(",")):
        out = []
        for name, order in ranks.items():
            mixed = four.clone()
            mixed[order[:rows]] = eight[order[:rows]]
            out.append(f"{name} {' / '.join(f'{math.exp(nll(mixed, k) - base[k]):.4f}' for k in KINDS)}")
        print(f"{rows} rows ({rows / vocab:.1%}): " + " | ".join(out), flush=True)


if __name__ == "__main__":
    main()
