"""Quantization goes through torchao and covers every linear layer (head included) and the embedding."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import patch

import torch
import torch.nn.functional as F
from torch import nn

from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.quant.configs import quantize_model
from exporter.recipe import load_recipe


def _quantized(ckpt_dir: Path, *overrides: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    ckpt = open_checkpoint(ckpt_dir)
    fp32 = load_model(ckpt, 32)
    quant = quantize_model(load_model(ckpt, 32), load_recipe("android-arm64", overrides).quantization)
    return fp32, quant


def test_every_linear_and_the_embedding_become_torchao_tensors(tiny_checkpoint: Path) -> None:
    _, model = _quantized(tiny_checkpoint)
    weights = {name: m.weight for name, m in model.named_modules() if isinstance(m, nn.Linear | nn.Embedding)}
    assert "output" in weights and "tok_embeddings" in weights
    for name, w in weights.items():
        assert type(w).__module__.startswith("torchao"), f"{name} is {type(w).__name__}"


def test_tied_embedding_is_untied_before_quantization(make_checkpoint) -> None:  # type: ignore[no-untyped-def]
    _, model = _quantized(make_checkpoint("tied", tie_word_embeddings=True))
    assert model.output.weight is not model.tok_embeddings.weight


def test_quantized_model_stays_close_to_fp32(tiny_checkpoint: Path) -> None:
    fp32, quant = _quantized(tiny_checkpoint)
    tokens = torch.randint(0, 4096, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = fp32(tokens, torch.tensor([0])), quant(tokens, torch.tensor([0]))
    cos = F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
    assert 0.98 < cos < 1.0  # changed (really quantized) but close


def test_scale_algorithm_is_a_recipe_setting(tiny_checkpoint: Path) -> None:
    # the device recipes train (QAT, affine only): a recipe without training chooses either
    ckpt = open_checkpoint(tiny_checkpoint)

    def with_algorithm(name: str) -> torch.nn.Module:
        overrides = ("quantization.linear.scheme='8da4w'", f"quantization.linear.scale_algorithm='{name}'")
        return quantize_model(load_model(ckpt, 32), load_recipe("reference-fp32", overrides).quantization)

    affine, hqq = with_algorithm("affine"), with_algorithm("hqq_scale_only")
    w_affine = affine.layers[0].attention.wq.weight.dequantize()
    w_hqq = hqq.layers[0].attention.wq.weight.dequantize()
    assert not torch.equal(w_affine, w_hqq)


def _parts(w: torch.Tensor) -> list[torch.Tensor]:
    return [getattr(w, n) for n in w.__tensor_flatten__()[0]]


def test_row_blocks_give_the_whole_weight_quantization() -> None:
    from exporter.quant.configs import (
        _apply,
        _embedding_config,
        linear_config,
        quantize_embedding,
        quantize_linears,
    )

    q = load_recipe("android-arm64", ()).quantization
    assert q.linear is not None and q.embedding is not None
    torch.manual_seed(0)
    weight = (torch.randn(100, 64) * torch.rand(100, 1)).to(torch.bfloat16)  # uneven last block
    cases = (
        (lambda: nn.Linear(64, 100, bias=False), linear_config(q.linear), quantize_linears, q.linear),
        (lambda: nn.Embedding(100, 64), _embedding_config(q.embedding), quantize_embedding, q.embedding),
    )
    for make, config, ours, setting in cases:
        whole, blocks = make(), make()
        whole.weight = nn.Parameter(weight.float(), requires_grad=False)
        _apply(whole, config, type(whole))  # torchao's quantize_ on the whole fp32 weight at once
        blocks.weight = nn.Parameter(weight, requires_grad=False)
        import exporter.quant.configs as quantize

        with (
            patch("exporter.quant.configs.BLOCK_ELEMENTS", 7 * 64),  # 7-row blocks, cast one at a time
            patch("exporter.quant.configs._like", wraps=quantize._like) as pieces,
        ):
            ours(blocks, setting, torch.float32)  # type: ignore[operator]
        assert pieces.call_count == 15  # the block path really ran: ceil(100 / 7) blocks
        assert type(blocks.weight) is type(whole.weight)
        for got, want in zip(_parts(blocks.weight), _parts(whole.weight), strict=True):
            assert torch.equal(got, want)
        x = torch.randint(0, 100, (1, 5)) if isinstance(whole, nn.Embedding) else torch.randn(1, 5, 64)
        assert torch.equal(blocks(x), whole(x))
