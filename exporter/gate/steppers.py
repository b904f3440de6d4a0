"""Greedy decoding and teacher-forced scoring, written once against the stepper convention.

A *stepper* is anything called as ``step(tokens int64[1, T], input_pos int64[1]) -> logits [1, V]``:
the eager exported module, an ExecuTorch method, an AOTInductor package (the backends load model
files as steppers; ``exporter.artifact.load`` loads an artifact folder's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backends import Stepper


def eager_stepper(module: torch.nn.Module) -> Stepper:
    def step(tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return module(tokens, input_pos)

    return step


@dataclass(frozen=True)
class Trace:
    """Logits a stepper produced along a fixed token sequence."""

    tokens: list[int]  # the tokens fed after the prompt (greedy choices of the reference)
    logits: torch.Tensor  # [steps, V], logits[i] predicts tokens[i]


def greedy(step: Stepper, prompt: Sequence[int], steps: int) -> Trace:
    """Prefill the prompt in one call, then decode ``steps`` tokens one at a time, greedily."""
    logits = step(torch.tensor([list(prompt)]), torch.tensor([0]))
    out_tokens, out_logits = [], []
    for i in range(steps):
        out_logits.append(logits[0].float())
        token = int(logits[0].argmax())
        out_tokens.append(token)
        if i + 1 < steps:
            logits = step(torch.tensor([[token]]), torch.tensor([len(prompt) + i]))
    return Trace(out_tokens, torch.stack(out_logits))


def follow(step: Stepper, prompt: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """Logits [len(tokens), V] the stepper gives along a fixed continuation (teacher forcing)."""
    logits = step(torch.tensor([list(prompt)]), torch.tensor([0]))
    rows = [logits[0].float()]
    for i, token in enumerate(tokens[:-1]):
        logits = step(torch.tensor([[token]]), torch.tensor([len(prompt) + i]))
        rows.append(logits[0].float())
    return torch.stack(rows)


def score(step: Stepper, ids: Sequence[int]) -> torch.Tensor:
    """Next-token logits [len(ids) - 1, V] for every position of ``ids`` after the first."""
    return follow(step, ids[:1], ids[1:])
