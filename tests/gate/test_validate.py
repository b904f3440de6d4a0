"""The gate's arithmetic on synthetic steppers whose logits we choose."""

from __future__ import annotations

import torch

from backends import Stepper
from exporter.gate.validate import (
    Reference,
    compare_greedy,
    distribution_figures,
    logit_error,
    stepper_teacher,
    top2_margin,
    validate,
)
from exporter.recipe import ValidationSettings

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


def compare(
    artifact: Stepper, eager: Stepper, prompts: list[list[int]], steps: int, tie: float = 0.05
) -> dict:  # type: ignore[type-arg]
    return compare_greedy(artifact, stepper_teacher(eager), prompts, steps, tie)


def test_identical_steppers_pass() -> None:
    step, _ = stepper()
    out = compare(step, step, [[1, 2, 3]], 32)
    assert out["greedy_tokens_identical_min"] == 32 and out["mismatches_not_at_ties"] == 0
    assert out["max_logit_abs_diff"] == 0 and out["max_logit_error"] == 0 and out["finite"]


def _flip(table: torch.Tensor, pos: int, by: float) -> torch.Tensor:
    """A bias that swaps the top two logits of row ``pos``, moving each by ``by`` x the margin."""
    top2 = table[pos].topk(2)
    margin = (top2.values[0] - top2.values[1]).item()
    swap = torch.zeros(V)
    swap[top2.indices[1]] = margin * by
    swap[top2.indices[0]] = -margin * by
    return swap


def test_a_real_divergence_fails_whatever_the_logit_error() -> None:
    eager, table = stepper()
    pos = 5  # prompt of 3 tokens: step i reads position 2 + i
    # The smallest error that flips the argmax (margin / 2 on each of two logits) and a huge one:
    # both are real divergences, since eager's margin here is far above the tie margin.
    for by in (0.51, 10.0):
        out = compare(stepper({pos: _flip(table, pos, by)})[0], eager, [[1, 2, 3]], 32)
        assert out["greedy_tokens_identical_min"] == pos - 2
        assert out["mismatches_not_at_ties"] == 1 and out["mismatches_at_ties"] == 0


def test_a_flip_is_excused_only_where_eager_has_no_favourite() -> None:
    _, table = stepper()
    pos = 7
    top2 = table[pos].topk(2)
    table[pos, top2.indices[1]] = top2.values[0] - 0.01  # eager's own margin: 0.01

    def near_tie(tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return table[int(input_pos[0]) + tokens.shape[1] - 1][None].clone()

    def flipped_near_tie(tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        p = int(input_pos[0]) + tokens.shape[1] - 1
        row = table[p].clone()
        if p == pos:
            row += _flip(table, pos, 0.6)
        return row[None]

    excused = compare(flipped_near_tie, near_tie, [[1, 2, 3]], 32, tie=0.05)
    assert excused["mismatches_at_ties"] == 1 and excused["mismatches_not_at_ties"] == 0
    strict = compare(flipped_near_tie, near_tie, [[1, 2, 3]], 32, tie=0.005)
    assert strict["mismatches_at_ties"] == 0 and strict["mismatches_not_at_ties"] == 1


def _reference(table: torch.Tensor) -> tuple[list[int], Reference]:
    ids = [i % V for i in range(20)]
    return ids, Reference(ids, table[:19])


def test_validate_reports_failures_naming_the_keys() -> None:
    eager, table = stepper()
    _, reference = _reference(table)
    artifact, _ = stepper({i: torch.randn(V, generator=torch.Generator().manual_seed(i)) for i in range(64)})
    strict = ValidationSettings(max_logit_error=0.01, min_top1_agreement=1.0, max_perplexity_ratio=1.0)
    out = validate(artifact, stepper_teacher(eager), [[1, 2]], reference, strict)
    assert not out["passed"]
    text = " ".join(out["failures"])
    assert "validation.max_logit_error" in text and "validation.max_kl_vs_eager" in text
    ok = validate(eager, stepper_teacher(eager), [[1, 2]], reference, strict)
    assert ok["passed"], ok["failures"]


def test_nan_logits_fail_every_way() -> None:
    eager, table = stepper()
    _, reference = _reference(table)
    nan = torch.full((V,), float("nan"))
    artifact, _ = stepper({4: nan})  # one position of the greedy run, one of the held-out text
    lenient = ValidationSettings(
        max_logit_error=1e9, max_kl_vs_eager=1e9, min_top1_agreement=1e-9, max_perplexity_ratio=1e9
    )
    out = validate(artifact, stepper_teacher(eager), [[1, 2]], reference, lenient)
    assert not out["passed"]
    assert any("NaN or Inf" in f for f in out["failures"])


def test_logit_error_is_scale_free() -> None:
    _, table = stepper()
    noisy = table + 0.1 * torch.randn(table.shape, generator=torch.Generator().manual_seed(3))
    small = logit_error(noisy, table)
    assert torch.allclose(logit_error(10 * noisy, 10 * table), small)


def test_agreement_counts_only_where_fp32_has_a_clear_favourite() -> None:
    _, table = stepper()
    _, reference = _reference(table)
    margins = top2_margin(reference.logits)
    clear = margins >= 1.0
    assert 0 < int(clear.sum()) < len(margins)
    # A candidate that flips every unclear position and keeps every clear one.
    candidate = reference.logits.clone()
    for i in (~clear).nonzero().flatten().tolist():
        candidate[i] += _flip(reference.logits, i, 0.6)
    fig = distribution_figures(candidate, reference, clear_margin=1.0)
    assert fig["top1_agreement_clear"] == 1.0 and fig["clear_positions"] == int(clear.sum())
    assert fig["top1_agreement"] == clear.float().mean().item()


def test_eager_gate_lookups_match_the_modules_without_dequantizing_whole_tables() -> None:
    from unittest.mock import patch

    from torch import nn

    from exporter.gate.validate import blockwise_linear, embedding_rows
    from exporter.quant.configs import quantize_embedding, quantize_linears
    from exporter.recipe import load_recipe

    q = load_recipe("android-arm64", ()).quantization
    torch.manual_seed(0)
    emb, head = nn.Embedding(300, 64), nn.Linear(64, 300, bias=False)
    tokens = torch.tensor([[5, 299, 5, 0, 17]])  # repeats and both ends of the table
    x = torch.randn(5, 64)
    for quantized in (False, True):
        if quantized:
            quantize_embedding(emb, q.embedding)
            quantize_linears(head, q.linear)
        with torch.no_grad(), patch("exporter.gate.validate.HEAD_BLOCK_ELEMENTS", 7 * 64):  # 43 blocks
            assert torch.equal(embedding_rows(emb, tokens), emb(tokens))
            assert torch.allclose(blockwise_linear(head, x), head(x), rtol=0, atol=1e-5)
