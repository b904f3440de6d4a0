"""Quantization-aware training: torchao's fake quantization is the arithmetic of the converted
model, training is deterministic, and the converted linears carry their planned precision."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.quant.configs import describe_weight, untie_embeddings
from exporter.quant.precision import linears
from exporter.quant.qat import convert, distill, prepare, train_windows
from exporter.recipe import LinearQuant, QuantizationAwareTraining

G32 = LinearQuant("8da4w", 32, "affine")
I8 = LinearQuant("8da8w", 0, "affine")


def _model(ckpt_dir: Path) -> nn.Module:
    return untie_embeddings(load_model(open_checkpoint(ckpt_dir), 128))


def _plan(model: nn.Module) -> dict[str, LinearQuant]:
    return {n: I8 if n.endswith("attention.wv") else G32 for n in linears(model)}


def _ids(n: int) -> list[int]:
    return torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(2)).tolist()


def _logits(model: nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]), torch.tensor([0]))
    model.reset_cache()
    return out


def test_fake_quantized_model_computes_what_the_converted_one_does(tiny_checkpoint: Path) -> None:
    model = _model(tiny_checkpoint)
    plan = _plan(model)
    fp32 = _logits(model, _ids(24))
    prepare(model, plan)
    fake = _logits(model, _ids(24))
    convert(model, plan)
    real = _logits(model, _ids(24))
    assert not torch.allclose(fake, fp32, atol=1e-3)  # quantization really is simulated
    assert torch.allclose(fake, real, atol=1e-4), (fake - real).abs().max()


def test_training_is_deterministic_and_converts_to_the_planned_precisions(tiny_checkpoint: Path) -> None:
    # one window, seen ten times: its KL must fall
    qat = QuantizationAwareTraining(steps=10, window_tokens=32, learning_rate=1e-4, threads=1)
    ids = _ids(32)
    runs = []
    for _ in range(2):
        model = _model(tiny_checkpoint)
        record = distill(model, _plan(model), qat, ids)
        runs.append((model, record))
    (a, rec), (b, _) = runs
    assert rec["steps"] == 10 and rec["seconds"] > 0
    assert rec["kl_last_tenth"] < 0.75 * rec["kl_first_tenth"]
    for name, m in linears(a).items():
        assert torch.equal(m.weight.dequantize(), linears(b)[name].weight.dequantize()), name
        words = describe_weight(m.weight)
        assert words.startswith("int8 per-channel" if name.endswith("wv") else "int4 g32"), (name, words)


def test_windows_are_a_seeded_permutation() -> None:
    qat = QuantizationAwareTraining(steps=5, window_tokens=10, seed=3)
    ids = list(range(40))
    got = train_windows(ids, qat)
    assert len(got) == 5 and got[4] == got[0]  # 4 windows, then again from the first
    assert sorted(w[0] for w in got[:4]) == [0, 10, 20, 30]
    assert train_windows(ids, qat) == got
