"""The escalation's steps and budget, on stand-in blocks and a stand-in measure (the whole build's
escalation: tests/quant/test_sequential.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exporter.gate.judge import windows_of
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.model.head import SplitHead, linear_of
from exporter.quant.configs import quantize_linears, quantize_model
from exporter.quant.escalate import (
    POOLED,
    HeadRows,
    Ladder,
    Raise,
    Score,
    Scores,
    Step,
    block_step,
    blocked_nll,
    escalate,
    head_rows,
    quantized_nll,
)
from exporter.quant.gptq import INT8, to_torchao
from exporter.quant.vocabulary import head_blocks, solve_head
from exporter.recipe import Escalation, load_recipe

RAISED = 1.0  # a raised stand-in linear's weight


def test_windows_score_every_token_once_within_the_cache() -> None:
    ids = list(range(100))
    windows = windows_of(ids, 8, 20)  # the judge's windowing, which the selection measure shares
    assert all(len(w) <= 8 for w in windows)
    scored = [t for w in windows for t in w[1:]]  # each window's first token is context
    assert scored == list(range(1, 21))


def ladder(errors: list[float], chosen: float = 1.0, extra: float = 10.0) -> Ladder:
    raises = [Raise(f"l{i}", nn.Linear(2, 2, bias=False), Path(f"l{i}"), extra) for i in range(len(errors))]
    for r in raises:
        nn.init.zeros_(r.module.weight)
    return Ladder(chosen, raises, errors)


def load(_: Raise) -> torch.Tensor:
    return torch.full((2, 2), RAISED)


def test_a_ladder_takes_the_raises_that_reach_the_target() -> None:
    steps = ladder([0.5, 0.2, 0.1])
    assert steps.count_for(2.0) == 0  # the block already meets it
    assert steps.count_for(0.5) == 1
    assert steps.count_for(0.15) == 3
    assert steps.count_for(0.01) == 3  # none reaches it: all of them


def test_a_block_step_applies_and_undoes() -> None:
    ladders = [ladder([0.5, 0.2]), ladder([0.25, 0.05])]
    step = block_step(ladders, 0.3, load)
    assert step is not None and step.extra == 30.0  # two raises of the first block, one of the second
    before = [r.module.weight for lad in ladders for r in lad.raises]
    undo = step.apply()
    assert [lad.taken for lad in ladders] == [2, 1]
    assert float(ladders[1].raises[0].module.weight.sum()) == 4 * RAISED
    undo()
    assert [lad.taken for lad in ladders] == [0, 0]
    assert [r.module.weight for lad in ladders for r in lad.raises] == before
    assert block_step([ladder([0.5], chosen=0.1)], 0.3, load) is None  # nothing left to take


def raised(ladders: list[Ladder]) -> int:
    return sum(lad.taken for lad in ladders)


def measure(
    ladders: list[Ladder], head: list[bool], per_raise: float, head_gain: float, spread: float
) -> Callable[[], Scores]:
    """A model whose ratio over all its selection tokens falls from 1.2 by ``per_raise`` per raised
    linear and ``head_gain`` with the head, its interval ``spread`` either side."""

    def ratios() -> Scores:
        worst = 1.2 - per_raise * raised(ladders) - (head_gain if head[0] else 0.0)
        return {
            "prose": Score(worst + 0.01, worst + 0.01 - 2 * spread, worst + 0.01 + 2 * spread),
            "code": Score(worst - 0.01, worst - 0.01 - 2 * spread, worst - 0.01 + 2 * spread),
            POOLED: Score(worst, worst - spread, worst + spread),
        }

    return ratios


def head_step(head: list[bool], extra: float) -> Callable[[], list[Step]]:
    """The head's one step, offered until it is taken."""

    def apply() -> Callable[[], None]:
        head[0] = True

        def undo() -> None:
            head[0] = False

        return undo

    return lambda: [] if head[0] else [Step("head to int8", extra, apply)]


SETTINGS = Escalation(aim=1.05, aim_size_ratio=1.1, bar=1.08, max_size_ratio=1.5, max_steps=8)


def run(
    per_raise: float,
    head_gain: float,
    head_extra: float,
    settings: Escalation = SETTINGS,
    spread: float = 0.01,
) -> tuple[dict[str, Any], list[Ladder], list[bool]]:
    ladders = [ladder([0.5 ** (i + 1) for i in range(6)]) for _ in range(3)]  # 18 raises of 10 bytes
    head = [False]
    record = escalate(
        settings,
        measure(ladders, head, per_raise, head_gain, spread),
        ladders,
        head_step(head, head_extra),
        target=1.0,
        bytes_now=1000.0,
        all4_bytes=1000.0,
        load=load,
    )
    return record, ladders, head


def test_steps_stop_at_the_aim() -> None:
    # each block step raises 3 linears (30 bytes, 0.03x) and gains 0.033: 1.2 -> 1.035 in five
    roomy = Escalation(aim=1.05, aim_size_ratio=1.5, bar=1.08, max_size_ratio=1.5)
    record, ladders, head = run(per_raise=0.011, head_gain=0.0, head_extra=50.0, settings=roomy)
    taken = record["taken"]
    assert isinstance(taken, list) and len(taken) == 6
    worst = [t["ratios"][POOLED][0] for t in taken]
    assert worst[0] == pytest.approx(1.2) and worst[-1] <= 1.05 < worst[-2]
    assert not head[0]  # it bought nothing
    assert taken[-1]["size_ratio"] == pytest.approx(1.15) and raised(ladders) == 15


def test_under_the_bar_only_the_aims_budget_is_spent() -> None:
    # 0.027 a step: under the bar (1.065) after five steps, at 1.15x; the aim's budget is 1.1x, so
    # the step that would reach the aim is not taken
    record, ladders, _ = run(per_raise=0.009, head_gain=0.0, head_extra=5000.0)
    taken = record["taken"]
    assert isinstance(taken, list) and len(taken) == 6
    assert taken[-1]["ratios"][POOLED][0] == pytest.approx(1.065)
    assert taken[-1]["size_ratio"] == pytest.approx(1.15) and raised(ladders) == 15


def test_the_step_with_more_gain_per_byte_wins() -> None:
    # the head: 0.2 for 50 bytes; a block step: 3 raises of 10 bytes at 0.01 each
    _, ladders, head = run(per_raise=0.01, head_gain=0.2, head_extra=50.0)
    assert head[0] and raised(ladders) == 0


def test_a_cheap_level_that_opens_a_rich_one_beats_a_costlier_head() -> None:
    # the first block level (3 raises, 30 bytes) buys 0.002, the second (6 raises) 0.14; the head
    # buys 0.05 for 50 bytes: better per byte than the first level alone, worse than the second
    ladders = [ladder([0.5 ** (i + 1) for i in range(6)]) for _ in range(3)]
    head = [False]

    def ratios() -> Scores:
        n = raised(ladders)
        worst = 1.2 - (0.002 if n == 3 else 0.14 if n >= 6 else 0.0) - (0.05 if head[0] else 0.0)
        return {POOLED: Score(worst, worst - 0.01, worst + 0.01)}

    record = escalate(SETTINGS, ratios, ladders, head_step(head, 50.0), 1.0, 1000.0, 1000.0, load)
    assert [t["step"] for t in record["taken"]] == ["recipe", "blocks to 0.25"]
    assert raised(ladders) == 6 and not head[0]


def test_a_model_at_its_aim_is_left_alone() -> None:
    record, ladders, head = run(
        per_raise=0.01, head_gain=0.2, head_extra=50.0, settings=Escalation(aim=1.2, bar=1.2)
    )
    assert [t["step"] for t in record["taken"]] == ["recipe"]  # type: ignore[union-attr]
    assert record["tried"] == [] and raised(ladders) == 0 and not head[0]


def test_a_step_that_does_not_help_is_not_taken() -> None:
    record, ladders, head = run(per_raise=0.0, head_gain=0.0, head_extra=50.0)
    assert [t["step"] for t in record["taken"]] == ["recipe"]  # type: ignore[union-attr]
    assert record["tried"] and raised(ladders) == 0 and not head[0]


def test_the_nll_in_vocabulary_blocks_is_cross_entropy() -> None:
    torch.manual_seed(0)
    head, hidden = torch.randn(50, 8), torch.randn(6, 8)
    ids = [3, 49, 0, 17, 25, 8, 44]
    blocks = head_blocks(lambda a, b: head[a:b], 50, lambda x: x)
    expected = F.cross_entropy(hidden @ head.T, torch.tensor(ids[1:]), reduction="none")
    with patch("exporter.quant.vocabulary.HEAD_ROWS", 16):  # blocks of 16, 16, 16 and 2 rows
        assert torch.allclose(blocked_nll(blocks, hidden, ids), expected, atol=1e-5)


def test_a_torchao_heads_rows_keep_its_rounding() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 40, bias=False)
    quantize_linears(linear, INT8)
    x = torch.randn(5, 64)
    whole = F.linear(x, linear.weight)
    parts = torch.cat(
        [F.linear(x, head_rows(linear.weight, a, min(a + 16, 40))) for a in range(0, 40, 16)], -1
    )
    assert type(head_rows(linear.weight, 0, 16)) is type(linear.weight)
    # the same products up to the order of float sums (a kernel's tiling differs by row count: exact
    # on some CPUs, 4e-7 apart on others), and the activations rounded as the whole weight rounds
    # them: without that rounding the product is 1e-2 away
    assert torch.allclose(parts, whole, rtol=0, atol=1e-5)
    assert not torch.allclose(F.linear(x, linear.weight.dequantize()), whole, rtol=0, atol=1e-3)


def test_the_selection_nll_is_the_quantized_models_own(tiny_checkpoint: Path) -> None:
    # rows looked up by hand and logits in vocabulary blocks: the model's own forward, to float
    # rounding (torchao's lookup dequantizes the whole table, which is what the hand lookup avoids)
    model = quantize_model(
        load_model(open_checkpoint(tiny_checkpoint), 64), load_recipe("android-arm64").quantization
    )
    ids = list(range(3, 40))
    with torch.no_grad():
        expected = F.cross_entropy(
            model(torch.tensor([ids]), torch.tensor([0]))[0, :-1].float(),
            torch.tensor(ids[1:]),
            reduction="none",
        )
    model.reset_cache()
    with patch("exporter.quant.vocabulary.HEAD_ROWS", 100):  # several blocks of the tiny vocabulary
        got = quantized_nll(model, ids)
    assert torch.allclose(got, expected, atol=1e-5)


def test_the_heads_rows_go_int8_costliest_first_each_size_once() -> None:
    torch.manual_seed(0)
    vocab, dim = 4096, 64
    head = torch.randn(vocab, dim).to(torch.bfloat16)
    x = torch.randn(512, dim) * torch.linspace(0.1, 3.0, dim)
    hessian = x.T @ x
    recipe = load_recipe("android-arm64")
    settings, base = recipe.quantization.gptq, recipe.quantization.linear
    assert settings is not None and base is not None
    int4 = linear_of(to_torchao(solve_head(head, hessian, base, settings), base, torch.float32))
    model = nn.Module()
    model.output = int4
    ranking = torch.randperm(vocab)
    rows = HeadRows(model, head, hessian, ranking, settings, base, torch.float32)  # type: ignore[arg-type]
    assert [s.name for s in rows.steps()] == [
        "head's costliest 32 rows to int8",
        "head's costliest 128 rows to int8",
        "head's costliest 512 rows to int8",
        "head to int8",
    ]
    step = rows.steps()[1]
    # the rows' int8 bytes over their int4 ones, and the split's int32 index of every entry
    assert step.extra == pytest.approx(128 * dim * (1 - 0.5 - 2 / 32) + 128 * 4 + 4 * vocab)
    undo = step.apply()
    assert isinstance(model.output, SplitHead) and rows.taken == 128
    # its own storage, not a view of the 512 rows solved: export writes a view's whole storage
    codes = model.output.first.weight.qdata
    assert codes.untyped_storage().nbytes() == codes.nbytes == 128 * dim
    with torch.no_grad():
        got = model.output(x[:5])
        picked = ranking[:128]
        int8 = linear_of(to_torchao(solve_head(head[picked], hessian, INT8, settings), INT8, torch.float32))
        want = int4(x[:5])
        want[:, picked] = int8(x[:5])
    assert torch.allclose(got, want, atol=1e-5)  # its rows int8, every other entry as it was
    assert [s.name for s in rows.steps()] == ["head's costliest 512 rows to int8", "head to int8"]
    assert rows.steps()[0].extra == pytest.approx(rows.extra(512) - rows.extra(128))
    undo()
    assert model.output is int4 and rows.taken == 0
