"""Step-by-step parity of our eager model with transformers on a checkpoint transformers wrote."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.model.transformer import Transformer
from exporter.model.transforms import replace_sdpa_with_custom_sdpa

PARITY_TOL = 1e-4
SEQ = 40  # longer than every test window (8), so rings wrap several times


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return model.eval()(tokens).logits


def stepwise(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of a prefill longer than any window, a chunk, then one token at a time."""
    cuts = [0, 12, 20, *range(21, tokens.shape[1] + 1)]
    with torch.no_grad():
        model.reset_cache()
        parts = [model(tokens[:, a:b], torch.tensor([a])) for a, b in itertools.pairwise(cuts)]
    return torch.cat(parts, 1)


def max_error(folder: Path, custom_sdpa: bool = False) -> float:
    """Largest |logit difference| of our fp32 model against transformers over ``SEQ`` positions,
    whole-sequence and step by step."""
    ckpt = open_checkpoint(folder)
    model = load_model(ckpt, max_seq_len=64)
    if custom_sdpa:
        replace_sdpa_with_custom_sdpa(model)
        model.init_buffers()
    tokens = torch.randint(0, ckpt.args.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(1))
    expected = hf_logits(folder, tokens)
    with torch.no_grad():
        whole = model(tokens, torch.tensor([0]))
    return max((whole - expected).abs().max().item(), (stepwise(model, tokens) - expected).abs().max().item())
