"""Quantization-aware training with torchao, distilled from the checkpoint itself.

The linears are swapped for torchao's fake-quantized linears at their planned precision (int8
per-token dynamic activations, and the planned weight precision: int4 group-wise with bf16 scales,
or int8 per channel), exactly the arithmetic the XNNPACK program runs; the model is then trained
for a fixed number of windows of calibration text to match the fp32 model's own next-token
distributions (mean KL(fp32 || student) per token). No dataset and no labels: the teacher is the
checkpoint. torchao's ``QATConfig(step="convert")`` then quantizes the trained weights with the
same configs a build without training uses.

What is trained: every linear weight and the RMSNorm scales; the embedding stays as stored (it is
quantized afterwards, like in every build). Deterministic: the window order comes from the seed,
AdamW has no randomness, and the thread count is fixed because float sums depend on it.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..model.transformer import Transformer
from ..plumbing.progress import progress
from ..plumbing.threads import fixed_threads
from ..recipe import LinearQuant, QuantizationAwareTraining
from .configs import linear_config

log = logging.getLogger("exporter")


def fake_quantize_config(q: LinearQuant) -> object:
    """torchao's fake-quantization of precision ``q``, as the XNNPACK program computes it."""
    from torchao.quantization.granularity import PerAxis
    from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

    activations = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    if q.scheme == "8da8w":
        weights = IntxFakeQuantizeConfig(torch.int8, granularity=PerAxis(0), is_symmetric=True)
    else:
        # bf16 scales, as the serializer stores group-wise scales (see quantize.linear_config)
        weights = IntxFakeQuantizeConfig(
            torch.int4,  # type: ignore[attr-defined]
            group_size=q.group_size,
            is_symmetric=True,
            scale_precision=torch.bfloat16,
        )
    return QATConfig(activation_config=activations, weight_config=weights, step="prepare")


def _by_precision(plan: Mapping[str, LinearQuant]) -> dict[LinearQuant, set[str]]:
    groups: dict[LinearQuant, set[str]] = {}
    for name, q in plan.items():
        groups.setdefault(q, set()).add(name)
    return groups


def prepare(model: nn.Module, plan: Mapping[str, LinearQuant]) -> None:
    from torchao.quantization import quantize_

    for q, names in _by_precision(plan).items():
        quantize_(model, fake_quantize_config(q), filter_fn=lambda m, fqn, names=names: fqn in names)  # type: ignore[arg-type]


def convert(model: nn.Module, plan: Mapping[str, LinearQuant]) -> None:
    """Fake-quantized linears -> linears quantized by the build's own torchao configs."""
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig

    for q, names in _by_precision(plan).items():
        config = QATConfig(linear_config(q), step="convert")
        quantize_(model, config, filter_fn=lambda m, fqn, names=names: fqn in names)  # type: ignore[arg-type]


def train_windows(ids: Sequence[int], qat: QuantizationAwareTraining) -> list[list[int]]:
    """The training windows in the order they are used: a seeded permutation of the text's
    windows, repeated if ``steps`` exceeds their number."""
    length = qat.window_tokens
    count = len(ids) // length
    if count == 0:
        raise ValueError("calibration text shorter than quantization.qat.window_tokens")
    order = torch.randperm(count, generator=torch.Generator().manual_seed(qat.seed)).tolist()
    return [list(ids[order[s % count] * length : (order[s % count] + 1) * length]) for s in range(qat.steps)]


def distill(
    model: Transformer, plan: Mapping[str, LinearQuant], qat: QuantizationAwareTraining, ids: Sequence[int]
) -> dict[str, Any]:
    """Train ``model`` (fp32, untied, every linear in ``plan``) in place and convert it; returns
    what the manifest records of the training."""
    teacher = copy.deepcopy(model)
    start = time.perf_counter()
    with fixed_threads(qat.threads):
        prepare(model, plan)
        for p in model.parameters():
            p.requires_grad_(False)
        trained = [p for n, p in model.named_parameters() if not n.startswith("tok_embeddings.")]
        for p in trained:
            p.requires_grad_(True)
        optimizer = torch.optim.AdamW(trained, lr=qat.learning_rate, weight_decay=0.0)
        losses: list[float] = []
        with progress("qat", total=qat.steps, unit="step") as tick:
            for window in train_windows(ids, qat):
                tokens, pos = torch.tensor([window]), torch.tensor([0])
                with torch.no_grad():
                    target = F.log_softmax(teacher(tokens, pos)[0].float(), -1)
                teacher.reset_cache()
                model.init_buffers()  # the KV cache is written in place: fresh buffers per step
                student = F.log_softmax(model(tokens, pos)[0].float(), -1)
                loss = F.kl_div(student, target, log_target=True, reduction="batchmean")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                losses.append(loss.item())
                tick()
        for p in model.parameters():
            p.requires_grad_(False)
        model.init_buffers()
        convert(model, plan)
    seconds = time.perf_counter() - start
    first, last = losses[: max(1, len(losses) // 10)], losses[-max(1, len(losses) // 10) :]
    return {
        "steps": qat.steps,
        "window_tokens": qat.window_tokens,
        "learning_rate": qat.learning_rate,
        "seed": qat.seed,
        "threads": qat.threads,
        "trained": "linear weights and RMSNorm scales (embedding frozen)",
        "kl_first_tenth": round(sum(first) / len(first), 5),
        "kl_last_tenth": round(sum(last) / len(last), 5),
        "seconds": round(seconds, 1),
    }
