"""tools.block_recon's scale training, on one block of the tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.quant.gptq import INT8, Quantized, solve
from exporter.quant.sequential import block_linears
from exporter.recipe import LinearQuant
from tools.block_recon import reconstruct

INT4 = LinearQuant(scheme="8da4w", group_size=32)


def test_training_recovers_scales_set_wrong(tiny_checkpoint: Path) -> None:
    """Scales 30% too large: the trained ones bring the held-out error down, codes stay, the int4
    scales stay bf16 (the grid XNNPACK reads) and the int8 ones fp32."""
    model = load_model(open_checkpoint(tiny_checkpoint), 64)
    block = model.layers[0]
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 32, model.args.dim, generator=g) for _ in range(12)]
    rope = model.rope_window(0, 32)
    with torch.no_grad():
        ys = [block(x, rope, 0) for x in xs]
    linears = block_linears(block)
    solved = {}
    for i, (name, m) in enumerate(linears.items()):
        grid = INT8 if i == 0 else INT4
        q = solve(m.weight, torch.eye(m.in_features), grid)
        wrong = (q.scales.float() * 1.3).to(q.scales.dtype)
        solved[name] = Quantized(q.codes, wrong, q.group_size)
    out, (before, after) = reconstruct(block, solved, xs, ys, rope, steps=24, lr=0.02)
    assert after < 0.7 * before, (before, after)
    for name, q in out.items():
        assert torch.equal(q.codes, solved[name].codes)
        assert q.scales.dtype == solved[name].scales.dtype
        assert not torch.equal(q.scales, solved[name].scales)
        assert torch.equal(linears[name].weight, q.dequantize())  # the block holds what is returned
