"""The validation gate: an artifact, run in its own runtime, against the eager model it came from
(same quantization) and against eager fp32. Thresholds come from the recipe."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .memory import release_memory
from .model import Transformer
from .recipe import ValidationSettings
from .runtime import Stepper, Trace, follow, greedy, score


@dataclass(frozen=True)
class Reference:
    """What eager fp32 gives on the held-out text; computed before the model is quantized."""

    ids: list[int]
    logits: torch.Tensor  # [len(ids) - 1, V]


def fp32_reference(model: Transformer, ids: Sequence[int]) -> Reference:
    return Reference(list(ids), full_logits(model, ids))


# ids -> logits [len(ids), V] at every position, from position 0 (an eager model's one prefill).
Teacher = Callable[[Sequence[int]], torch.Tensor]


def model_teacher(model: Transformer) -> Teacher:
    """A ``Transformer``'s every-position logits in one forward. On a large eager quantized model
    (torchao dequantizes every weight on every call) one forward per prompt instead of one per
    decoded token is what keeps the gate from dominating the build: 1B shape, 457 s -> seconds."""

    def teach(ids: Sequence[int]) -> torch.Tensor:
        tokens = torch.tensor([list(ids)])
        with torch.no_grad():
            h = model.hidden(tokens, torch.tensor([0]), embedded=embedding_rows(model.tok_embeddings, tokens))
            logits = blockwise_linear(model.output, h[0]).float()
        model.reset_cache()
        return logits

    return teach


# Output rows per block of a head evaluated blockwise: 8M weights, 32 MB once dequantized to fp32.
HEAD_BLOCK_ELEMENTS = 1 << 23


def _dequantizes_whole(weight: torch.Tensor) -> bool:
    """A torchao weight that dequantizes itself whole on every call, and can be sliced by rows.
    Plain tensors need neither, and the packed int4 server layout cannot be sliced."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    return isinstance(weight, IntxUnpackedToInt8Tensor)


def embedding_rows(embedding: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
    """``embedding(tokens)``, one table row per distinct token. torchao's quantized embedding
    dequantizes the whole table to fp32 before it gathers: 1 GB on a 1B model, on every call."""
    w = embedding.weight
    if not _dequantizes_whole(w):
        return embedding(tokens)
    distinct, where = tokens.unique(return_inverse=True)
    rows = torch.cat([F.embedding(torch.tensor([0]), w[t : t + 1]) for t in distinct.tolist()])
    return rows[where]


def blockwise_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)``, a block of output rows at a time. A torchao-quantized linear dequantizes its
    whole weight to fp32 on every call: for a 1B model's [128256, 2048] head that is 1 GB, and
    in the gate's eager forward it was the build's peak (+1.9 GB over the resident model).
    Sliced, the transient is one block; each output is the same dot product either way."""
    w, b = linear.weight, linear.bias
    if not _dequantizes_whole(w):
        return linear(x)
    rows = max(1, HEAD_BLOCK_ELEMENTS // w.shape[1])
    blocks = range(0, w.shape[0], rows)
    return torch.cat(
        [F.linear(x, w[r : r + rows], None if b is None else b[r : r + rows]) for r in blocks], -1
    )


def stepper_teacher(step: Stepper) -> Teacher:
    """The same from a stepper, one token at a time (synthetic steppers in tests)."""
    return lambda ids: follow(step, list(ids[:1]), [*ids[1:], 0])


def full_logits(model: Transformer, ids: Sequence[int]) -> torch.Tensor:
    """Next-token logits [len(ids) - 1, V] of a ``Transformer`` in one prefill from position 0."""
    return model_teacher(model)(ids)[:-1]


def distribution_figures(logits: torch.Tensor, ref: Reference) -> dict[str, float]:
    """Perplexity, top-1 agreement with fp32 and mean KL(fp32 || candidate) per token."""
    targets = torch.tensor(ref.ids[1:])
    nll = F.cross_entropy(logits, targets).item()
    ref_logp = F.log_softmax(ref.logits, -1)
    kl = F.kl_div(F.log_softmax(logits, -1), ref_logp, log_target=True, reduction="batchmean")
    return {
        "perplexity": math.exp(nll),
        "top1_agreement": (logits.argmax(-1) == ref.logits.argmax(-1)).float().mean().item(),
        "mean_kl": kl.item(),
    }


def perplexity_of(ref: Reference) -> float:
    return math.exp(F.cross_entropy(ref.logits, torch.tensor(ref.ids[1:])).item())


def compare_greedy(
    artifact: Stepper, eager: Teacher, prompts: Sequence[Sequence[int]], steps: int
) -> dict[str, Any]:
    """The artifact decodes greedily in its runtime; eager is run teacher-forced on the same tokens,
    so logits are compared on the same contexts and an argmax mismatch at a step is where a greedy
    decode by eager would have diverged.

    A mismatch is *at a tie* when eager's own top-2 margin is no larger than twice the artifact's
    logit error at that step: logits within e of each other can only swap an argmax whose margin
    is below 2e, so such a flip says nothing the logit tolerance does not already bound. Every other
    mismatch fails the gate. Both counts are reported."""
    return compare_runs([greedy(artifact, p, steps) for p in prompts], eager, prompts, steps)


def compare_runs(
    runs: Sequence[Trace], eager: Teacher, prompts: Sequence[Sequence[int]], steps: int
) -> dict[str, Any]:
    """``compare_greedy`` on greedy runs the artifact has already made."""
    per_prompt: list[dict[str, Any]] = []
    for prompt, run in zip(prompts, runs, strict=True):
        ref = eager([*prompt, *run.tokens[:-1]])[len(prompt) - 1 :]  # [steps, V]
        diff = (run.logits - ref).abs().amax(-1)  # [steps]
        top2 = ref.topk(2, -1).values
        margin = top2[:, 0] - top2[:, 1]
        mismatched = (ref.argmax(-1) != torch.tensor(run.tokens)).nonzero().flatten().tolist()
        ties = [i for i in mismatched if margin[i] <= 2 * diff[i]]
        per_prompt.append(
            {
                "prompt_tokens": len(prompt),
                "greedy_tokens_identical": mismatched[0] if mismatched else steps,
                "mismatches_at_ties": [
                    {"step": i, "eager_margin": margin[i].item(), "logit_abs_diff": diff[i].item()}
                    for i in ties
                ],
                "mismatches_not_at_ties": [i for i in mismatched if i not in ties],
                "max_logit_abs_diff": diff.max().item(),
                "artifact_tokens": run.tokens,
            }
        )
    return {
        "steps": steps,
        "greedy_tokens_identical_min": min(p["greedy_tokens_identical"] for p in per_prompt),
        "mismatches_not_at_ties": sum(len(p["mismatches_not_at_ties"]) for p in per_prompt),
        "mismatches_at_ties": sum(len(p["mismatches_at_ties"]) for p in per_prompt),
        "max_logit_abs_diff": max(p["max_logit_abs_diff"] for p in per_prompt),
        "prompts": per_prompt,
    }


def validate(
    artifact: Stepper,
    eager: Teacher,
    prompts: Sequence[Sequence[int]],
    reference: Reference,
    settings: ValidationSettings,
) -> dict[str, Any]:
    """All figures plus ``failures`` (empty when every threshold is met).

    The artifact runs first and is dropped (this must be the last reference to it) before eager
    runs: its runtime (a 1B program's file data and XNNPACK's packed weights, 1.5 GB) and eager's
    forward transients are then never resident together."""
    runs = [greedy(artifact, p, settings.greedy_steps) for p in prompts]
    artifact_logits = score(artifact, reference.ids)
    del artifact
    release_memory()
    vs_eager = compare_runs(runs, eager, prompts, settings.greedy_steps)
    fp32_ppl = perplexity_of(reference)
    artifact_fig = distribution_figures(artifact_logits, reference)
    eager_fig = distribution_figures(eager(reference.ids)[:-1], reference)
    ratio = artifact_fig["perplexity"] / fp32_ppl
    failures = []
    if vs_eager["mismatches_not_at_ties"]:
        failures.append(
            f"{vs_eager['mismatches_not_at_ties']} greedy token(s) differ from eager where eager's "
            f"top-2 margin exceeds twice the logit error (first divergence after "
            f"{vs_eager['greedy_tokens_identical_min']} of {settings.greedy_steps} steps)"
        )
    if vs_eager["max_logit_abs_diff"] > settings.max_logit_abs_diff:
        failures.append(
            f"max |logit - eager logit| {vs_eager['max_logit_abs_diff']:.4g} > "
            f"{settings.max_logit_abs_diff:.4g}"
        )
    if artifact_fig["top1_agreement"] < settings.min_top1_agreement:
        failures.append(
            f"top-1 agreement with fp32 {artifact_fig['top1_agreement']:.4f} < {settings.min_top1_agreement}"
        )
    if ratio > settings.max_perplexity_ratio:
        failures.append(f"perplexity ratio to fp32 {ratio:.4f} > {settings.max_perplexity_ratio}")
    return {
        "passed": not failures,
        "failures": failures,
        "thresholds": {
            "greedy_steps": settings.greedy_steps,
            "max_logit_abs_diff": settings.max_logit_abs_diff,
            "min_top1_agreement": settings.min_top1_agreement,
            "max_perplexity_ratio": settings.max_perplexity_ratio,
        },
        "vs_eager": vs_eager,
        "vs_fp32": {
            "eval_tokens": len(reference.ids) - 1,
            "fp32_perplexity": fp32_ppl,
            "artifact": artifact_fig,
            "eager_quantized": eager_fig,
            "perplexity_ratio": ratio,
        },
    }
