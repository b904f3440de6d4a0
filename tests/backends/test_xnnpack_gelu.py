"""Why ``replace_gelu_tanh_with_sigmoid_form`` exists: ExecuTorch 1.5.1's XNNPACK lowering computes
``gelu(approximate="tanh")`` as erf GELU. The first test holds upstream to that (when it fails,
the lowering was fixed and the transform can go); the second shows our form lowers exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from exporter.model.transformer import GeluTanh
from exporter.model.transforms import SigmoidGeluTanh

X = torch.randn(1, 8, 512, generator=torch.Generator().manual_seed(0)) * 4
EXPECTED = F.gelu(X.double(), approximate="tanh").float()


def lowered(module: torch.nn.Module, tmp_path: Path) -> torch.Tensor:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    program = to_edge_transform_and_lower(
        torch.export.export(module, (X,)), partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    path = tmp_path / "gelu.pte"
    path.write_bytes(program.buffer)
    return Runtime.get().load_program(str(path)).load_method("forward").execute([X])[0]


def test_upstream_lowers_gelu_tanh_as_erf_gelu(tmp_path: Path) -> None:
    y = lowered(GeluTanh(), tmp_path)
    assert (y - F.gelu(X)).abs().max().item() < 1e-5  # erf GELU ...
    assert (y - EXPECTED).abs().max().item() > 1e-4  # ... not the tanh form asked for


@pytest.mark.parametrize("module", [SigmoidGeluTanh()], ids=["sigmoid-form"])
def test_our_form_lowers_to_gelu_tanh(module: torch.nn.Module, tmp_path: Path) -> None:
    assert (lowered(module, tmp_path) - EXPECTED).abs().max().item() < 1e-5
