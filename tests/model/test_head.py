"""A head split between two linears computes the logits of the one it was split from."""

from __future__ import annotations

import torch
from torch import nn

from exporter.model.head import SplitHead, head_parts, linear_of, other_rows


def split(weight: torch.Tensor, rows: torch.Tensor) -> SplitHead:
    return SplitHead(linear_of(weight[rows]), linear_of(weight[other_rows(rows, weight.shape[0])]), rows)


def test_a_split_head_gives_the_logits_in_vocabulary_order() -> None:
    torch.manual_seed(0)
    weight, x = torch.randn(50, 8), torch.randn(2, 3, 8)
    rows = torch.tensor([41, 3, 17, 0, 49])  # in no order: the first linear's rows as ranked
    head = split(weight, rows)
    assert torch.allclose(head(x), x @ weight.T, atol=1e-6)
    linears, place = head_parts(head)
    assert place is not None and [lin.out_features for lin in linears] == [5, 45]
    stored = torch.cat([lin.weight for lin in linears])
    assert torch.equal(stored[place], weight)  # each entry's row is where place says


def test_a_plain_head_is_its_own_part() -> None:
    head = nn.Linear(8, 50, bias=False)
    assert head_parts(head) == ([head], None)


def test_the_index_is_stored_as_int32() -> None:
    # V entries per model in the artifact: half the bytes of int64
    assert split(torch.randn(50, 8), torch.tensor([1, 2])).place.dtype == torch.int32
