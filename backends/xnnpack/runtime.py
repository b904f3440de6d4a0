"""The consumer side of the XNNPACK backend: a ``.pte`` program loaded in ExecuTorch's Python runtime."""

from __future__ import annotations

from pathlib import Path

import torch

from exporter.errors import ArtifactError

from .. import Stepper


def load_executorch_kernels() -> None:
    """Register the kernels our programs need outside the delegate, before a program is loaded."""
    # llama::custom_sdpa, llama::update_cache; quantized_decomposed::embedding_4bit
    import executorch.extension.llm.custom_ops.custom_ops
    import executorch.kernels.quantized  # noqa: F401


def load_pte(path: Path) -> Stepper:
    """An ExecuTorch program's ``forward`` as a stepper (ExecuTorch's Python runtime)."""
    load_executorch_kernels()
    from executorch.runtime import Runtime

    try:
        method = Runtime.get().load_program(Path(path)).load_method("forward")
    except Exception as e:  # the runtime raises RuntimeError/ValueError with the ET error code
        raise ArtifactError(path, f"ExecuTorch cannot load this program ({e})") from e
    if method is None:
        raise ArtifactError(path, "program has no 'forward' method")

    def step(tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        (logits,) = method.execute([tokens, input_pos])
        return logits.clone()  # the output buffer is reused by the next call

    return step
