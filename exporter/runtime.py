"""Run artifacts in their own runtimes and the eager model with the same calling convention.

A *stepper* is anything called as ``step(tokens int64[1, T], input_pos int64[1]) -> logits [1, V]``:
the eager exported module, an ExecuTorch method, an AOTInductor package. Greedy decoding and
teacher-forced scoring are written once, against that convention.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backends import Stepper

from .errors import ArtifactError, ExporterError


@contextmanager
def native_logs_captured() -> Iterator[None]:
    """ExecuTorch's C++ runtime logs every kernel call to fd 2 ("No temp allocator provided", ...).
    Park fd 1 and 2 in a temporary file while it runs; replay it only if the block fails with
    something other than our own one-line errors (which already say what is wrong)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except ExporterError:
            raise
        except BaseException:
            os.dup2(saved[1], 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace")[-4000:])
            raise
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


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


def load_artifact(folder: Path, manifest: dict[str, Any]) -> Stepper:
    """The artifact's model file as a stepper, in the runtime of the backend that built it."""
    from backends import get_backend

    from .manifest import check_torch_matches, listed_file

    model_file = listed_file(folder, manifest, "artifact")
    check_torch_matches(manifest, model_file)
    return get_backend(manifest["recipe"]["resolved"]["backend"]).load(model_file)


def eager_stepper(module: torch.nn.Module) -> Stepper:
    def step(tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return module(tokens, input_pos)

    return step


@dataclass(frozen=True)
class Trace:
    """Logits a stepper produced along a fixed token sequence."""

    tokens: list[int]  # the tokens fed after the prompt (greedy choices of the reference)
    logits: torch.Tensor  # [steps, V], logits[i] predicts tokens[i]


def greedy(step: Stepper, prompt: Sequence[int], steps: int) -> Trace:
    """Prefill the prompt in one call, then decode ``steps`` tokens one at a time, greedily."""
    logits = step(torch.tensor([list(prompt)]), torch.tensor([0]))
    out_tokens, out_logits = [], []
    for i in range(steps):
        out_logits.append(logits[0].float())
        token = int(logits[0].argmax())
        out_tokens.append(token)
        if i + 1 < steps:
            logits = step(torch.tensor([[token]]), torch.tensor([len(prompt) + i]))
    return Trace(out_tokens, torch.stack(out_logits))


def follow(step: Stepper, prompt: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """Logits [len(tokens), V] the stepper gives along a fixed continuation (teacher forcing)."""
    logits = step(torch.tensor([list(prompt)]), torch.tensor([0]))
    rows = [logits[0].float()]
    for i, token in enumerate(tokens[:-1]):
        logits = step(torch.tensor([[token]]), torch.tensor([len(prompt) + i]))
        rows.append(logits[0].float())
    return torch.stack(rows)


def score(step: Stepper, ids: Sequence[int]) -> torch.Tensor:
    """Next-token logits [len(ids) - 1, V] for every position of ``ids`` after the first."""
    return follow(step, ids[:1], ids[1:])
