"""Golden vectors against a deterministic stand-in program: recorded, reproduced, and a changed
program is caught; near-ties may flip."""

from __future__ import annotations

import torch

from exporter.artifact.golden import check_golden, make_golden

VOCAB = 16


def program(bias: torch.Tensor | None = None):  # type: ignore[no-untyped-def]
    """A stateful stand-in: logits depend on the last token and the position."""

    def step(tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        pos = int(input_pos[0]) + tokens.shape[1] - 1
        last = int(tokens[0, -1])
        logits = torch.sin(torch.arange(VOCAB, dtype=torch.float32) * (last + 1) + pos) * 4
        return (logits if bias is None else logits + bias)[None]

    return step


def test_the_same_program_reproduces_its_golden_vectors() -> None:
    golden = make_golden(program(), [[1, 2, 3], [5]], decode_steps=4, top_k=4)
    assert len(golden["cases"]) == 2 and all(len(c["expected"]) == 5 for c in golden["cases"])
    assert golden["logit_atol"] == 0.004  # 1e-3 of the largest |logit| (4)
    assert check_golden(program(), golden) == []


def test_a_changed_program_is_caught() -> None:
    golden = make_golden(program(), [[1, 2, 3]], decode_steps=4, top_k=4)
    small = torch.full((VOCAB,), 0.001)
    assert check_golden(program(small), golden) == []  # within tolerance
    problems = check_golden(program(torch.linspace(0, 3, VOCAB)), golden)
    assert problems and any("logits differ" in p for p in problems)
    assert any("greedy token" in p for p in problems)


def fixed(values: dict[int, float]):  # type: ignore[no-untyped-def]
    logits = torch.zeros(VOCAB)
    for i, v in values.items():
        logits[i] = v
    return lambda tokens, input_pos: logits[None].clone()


def test_a_flip_at_a_near_tie_is_not_a_mismatch() -> None:
    golden = make_golden(fixed({3: 5.001, 7: 5.0}), [[1]], decode_steps=0, top_k=2)
    assert golden["cases"][0]["expected"][0]["token"] == 3 and golden["logit_atol"] > 0.001
    assert check_golden(fixed({3: 5.0, 7: 5.001}), golden) == []  # the tie broken the other way
    clear = make_golden(fixed({3: 5.0, 7: 4.0}), [[1]], decode_steps=0, top_k=2)
    assert any("greedy token 7" in p for p in check_golden(fixed({3: 5.0, 7: 5.5}), clear))
