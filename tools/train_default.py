"""Train the small default model that ships with the project (``python -m tools.train_default``).

Corpus: the Python sources of the interpreter's own standard library, which every machine has.
Tokenizer: byte-level BPE trained with ``tokenizers``. Model: a Llama-family decoder trained with
Hugging Face transformers' ``LlamaForCausalLM`` and written with ``save_pretrained``, so the shipped
checkpoint is one that transformers itself wrote. Needs the ``dev`` extra (transformers).

The learning-rate schedule runs on the fraction of a wall-clock budget spent, so the script finishes
in the same time on any machine; the figures it reaches are written beside the weights.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sysconfig
import time
from pathlib import Path

import torch

import exporter

DEFAULT_OUT = Path(exporter.__file__).parent / "data" / "pycode-4m"
BOS, EOS = "<|bos|>", "<|endoftext|>"
HELDOUT_EVERY = 25  # every 25th stdlib file (sorted by path) is held out from tokenizer and model


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return [p for p in files if p.stat().st_size < 400_000]


def split_corpus(files: list[Path]) -> tuple[list[str], list[str]]:
    train: list[str] = []
    heldout: list[str] = []
    for i, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")
        (heldout if i % HELDOUT_EVERY == 0 else train).append(text)
    return train, heldout


def train_tokenizer(texts: list[str], vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # BOS through the tokenizer's own template, so runners that follow tokenizer.json (ExecuTorch's
    # HF tokenizer in TextLLMRunner) prepend it exactly as transformers does.
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def encode_all(tok, texts: list[str]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def evaluate(model, data: torch.Tensor, seq_len: int, windows: int) -> float:  # type: ignore[no-untyped-def]
    model.eval()
    losses = []
    step = max(1, (len(data) - seq_len - 1) // windows)
    for start in range(0, len(data) - seq_len - 1, step)[:windows]:
        x = data[start : start + seq_len][None]
        losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(opts.seed)
    random.seed(opts.seed)
    t0 = time.time()
    train_texts, heldout_texts = split_corpus(stdlib_files())
    tok = train_tokenizer(train_texts, opts.vocab_size)
    train_ids, heldout_ids = encode_all(tok, train_texts), encode_all(tok, heldout_texts)
    print(
        f"corpus: {len(train_ids):,} train tokens, {len(heldout_ids):,} held-out tokens "
        f"({time.time() - t0:.0f} s)",
        flush=True,
    )

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
    )
    model = LlamaForCausalLM(config)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=0.1, betas=(0.9, 0.95))
    budget = opts.minutes * 60
    start, step, loss_ema = time.time(), 0, None
    while (frac := (time.time() - start) / budget) < 1.0:
        # Linear warm-up over the first 3% of the budget, then cosine decay to 10%.
        lr_scale = frac / 0.03 if frac < 0.03 else 0.1 + 0.45 * (1 + math.cos(math.pi * frac))
        for group in optim.param_groups:
            group["lr"] = opts.lr * lr_scale
        starts = torch.randint(0, len(train_ids) - opts.seq_len - 1, (opts.batch_size,))
        x = torch.stack([train_ids[s : s + opts.seq_len] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        loss_ema = loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * loss.item()
        step += 1
        if step % 50 == 0:
            print(
                f"step {step} loss {loss_ema:.3f} lr {opts.lr * lr_scale:.2e} ({time.time() - start:.0f} s)",
                flush=True,
            )

    train_loss = evaluate(model, train_ids, opts.seq_len, 64)
    heldout_loss = evaluate(model, heldout_ids, opts.seq_len, 64)
    opts.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(opts.out)  # type: ignore[arg-type]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)
    fast.save_pretrained(opts.out)
    heldout_text = "".join(heldout_texts)[:24_000]
    (opts.out / "heldout.txt").write_text(heldout_text, encoding="utf-8")
    report = {
        "corpus": f"CPython {platform.python_version()} standard library (*.py), "
        f"every {HELDOUT_EVERY}th file held out",
        "train_tokens": len(train_ids),
        "heldout_tokens": len(heldout_ids),
        "steps": step,
        "batch_size": opts.batch_size,
        "seq_len": opts.seq_len,
        "tokens_seen": step * opts.batch_size * opts.seq_len,
        "minutes": opts.minutes,
        "train_loss": round(train_loss, 4),
        "heldout_loss": round(heldout_loss, 4),
        "heldout_perplexity": round(math.exp(heldout_loss), 3),
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "seed": opts.seed,
    }
    (opts.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
