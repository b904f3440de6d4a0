"""The gate's arithmetic on synthetic steppers whose logits we choose."""

from __future__ import annotations

import torch

from exporter.recipe import ValidationSettings
from exporter.runtime import Stepper
from exporter.validate import Reference, compare_greedy, stepper_teacher, validate

V = 8


def stepper(bias: dict[int, torch.Tensor] | None = None):  # type: ignore[no-untyped-def]
    """Logits depend only on the position of the last token: row p of a fixed table (+ bias)."""
    table = torch.randn(64, V, generator=torch.Generator().manual_seed(0)) * 3

    def step(tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        pos = int(input_pos[0]) + tokens.shape[1] - 1
        row = table[pos].clone()
        if bias and pos in bias:
            row += bias[pos]
        return row[None]

    return step, table


def compare(artifact: Stepper, eager: Stepper, prompts: list[list[int]], steps: int) -> dict:  # type: ignore[type-arg]
    return compare_greedy(artifact, stepper_teacher(eager), prompts, steps)


def test_identical_steppers_pass() -> None:
    step, _ = stepper()
    out = compare(step, step, [[1, 2, 3]], 32)
    assert out["greedy_tokens_identical_min"] == 32 and out["mismatches_not_at_ties"] == 0
    assert out["max_logit_abs_diff"] == 0


def test_real_divergence_fails_and_tie_flip_is_recorded() -> None:
    eager, table = stepper()
    pos = 5  # prompt of 3 tokens: step i reads position 2 + i
    top2 = table[pos].topk(2)
    margin = (top2.values[0] - top2.values[1]).item()
    swap = torch.zeros(V)
    # Push the runner-up just past the winner: a flip with error > margin / 2 -> counted as a tie.
    swap[top2.indices[1]] = margin * 0.6
    swap[top2.indices[0]] = -margin * 0.6
    tie = compare(stepper({pos: swap})[0], eager, [[1, 2, 3]], 32)
    assert tie["greedy_tokens_identical_min"] == pos - 2
    assert tie["mismatches_at_ties"] == 1 and tie["mismatches_not_at_ties"] == 0
    big = torch.zeros(V)
    big[top2.indices[1]] = margin + 10.0  # flips by a huge error on one logit only
    real = compare(stepper({pos: big})[0], eager, [[1, 2, 3]], 32)
    assert real["mismatches_at_ties"] == 1  # margin <= 2 * error: bounded by the logit tolerance
    assert real["max_logit_abs_diff"] > 10


def test_validate_reports_failures() -> None:
    eager, table = stepper()
    ids = [i % V for i in range(20)]
    reference = Reference(ids, table[:19])
    artifact, _ = stepper({i: torch.full((V,), 0.5) for i in range(64)})
    strict = ValidationSettings(max_logit_abs_diff=0.1, min_top1_agreement=1.0, max_perplexity_ratio=1.0)
    out = validate(artifact, stepper_teacher(eager), [[1, 2]], reference, strict)
    assert not out["passed"]
    assert any("max |logit - eager logit|" in f for f in out["failures"])
    ok = validate(eager, stepper_teacher(eager), [[1, 2]], reference, strict)
    assert ok["passed"], ok["failures"]


def test_eager_gate_lookups_match_the_modules_without_dequantizing_whole_tables() -> None:
    from unittest.mock import patch

    from torch import nn

    from exporter.quantize import quantize_embedding, quantize_linears
    from exporter.recipe import load_recipe
    from exporter.validate import blockwise_linear, embedding_rows

    q = load_recipe("android-arm64", ()).quantization
    torch.manual_seed(0)
    emb, head = nn.Embedding(300, 64), nn.Linear(64, 300, bias=False)
    tokens = torch.tensor([[5, 299, 5, 0, 17]])  # repeats and both ends of the table
    x = torch.randn(5, 64)
    for quantized in (False, True):
        if quantized:
            quantize_embedding(emb, q.embedding)
            quantize_linears(head, q.linear)
        with torch.no_grad(), patch("exporter.validate.HEAD_BLOCK_ELEMENTS", 7 * 64):  # 43 blocks
            assert torch.equal(embedding_rows(emb, tokens), emb(tokens))
            assert torch.allclose(blockwise_linear(head, x), head(x), rtol=0, atol=1e-5)
