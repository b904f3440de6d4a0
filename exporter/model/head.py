"""A head whose vocabulary rows are split between two linears of different precision.

Most of what a 4-bit head costs comes from a few rows: the entries the model gives probability to,
whose logit errors the softmax does not drown (Qwen2.5-0.5B's 4-bit head costs 1.013 / 1.024 in
perplexity on other prose / code; 8 bits on its 2,000 costliest rows, 1.3% of them, recover most of
it: docs/quality.md). XNNPACK takes one grid per linear, so a head of two precisions is two linears
over a partition of the rows, their logits put back in vocabulary order by one gather.
"""

from __future__ import annotations

import torch
from torch import nn


class SplitHead(nn.Module):
    """``first`` computes the logits of vocabulary entries ``rows`` (in that order), ``rest`` those
    of every other entry in ascending order; ``place`` [V] is each entry's index in their concatenation."""

    place: torch.Tensor

    def __init__(self, first: nn.Linear, rest: nn.Linear, rows: torch.Tensor) -> None:
        super().__init__()
        self.first, self.rest = first, rest
        vocab = first.out_features + rest.out_features
        order = torch.cat([rows, other_rows(rows, vocab)])
        # int32: half the bytes of int64 in the artifact (ExecuTorch's index_select takes either)
        place = torch.empty(vocab, dtype=torch.int32)
        place[order] = torch.arange(vocab, dtype=torch.int32)
        self.register_buffer("place", place)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.first(x), self.rest(x)], -1).index_select(-1, self.place)


def other_rows(rows: torch.Tensor, vocab: int) -> torch.Tensor:
    """The vocabulary entries not in ``rows``, ascending: a ``SplitHead``'s ``rest``."""
    others = torch.ones(vocab, dtype=torch.bool)
    others[rows] = False
    return others.nonzero()[:, 0]


def head_parts(head: nn.Module) -> tuple[list[nn.Linear], torch.Tensor | None]:
    """A head's linears in the order their rows are stored, and each vocabulary entry's index among
    those rows (None: the rows are the vocabulary's, in order)."""
    if isinstance(head, SplitHead):
        return [head.first, head.rest], head.place.long()
    assert isinstance(head, nn.Linear)
    return [head], None


def linear_of(weight: torch.Tensor) -> nn.Linear:
    """A bias-free linear holding ``weight`` [out, in] as it is (a torchao tensor stays one)."""
    with torch.device("meta"):
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    return linear
