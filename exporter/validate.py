"""The validation gate: an artifact, run in its own runtime, against the eager model it came from
(same quantization) and against eager fp32. Thresholds come from the recipe."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .recipe import ValidationSettings
from .runtime import Stepper, Trace, follow, greedy, score


@dataclass(frozen=True)
class Reference:
    """What eager fp32 gives on the held-out text; computed before the model is quantized."""

    ids: list[int]
    logits: torch.Tensor  # [len(ids) - 1, V]


def fp32_reference(model: torch.nn.Module, ids: Sequence[int]) -> Reference:
    return Reference(list(ids), full_logits(model, ids))


@dataclass(frozen=True)
class EagerRun:
    """What the eager quantized model gives on the gate's prompts and text. Computed right after
    quantization, so the eager model is gone before the artifact is loaded beside it."""

    prompts: list[list[int]]
    traces: list[Trace]  # greedy decode per prompt
    scored: torch.Tensor  # teacher-forced logits on the reference ids, [len(ids) - 1, V]


def run_eager(
    eager: Stepper,
    prompts: Sequence[Sequence[int]],
    reference: Reference,
    steps: int,
    model: torch.nn.Module | None = None,
) -> EagerRun:
    """``model``, when given, is the eager ``Transformer`` behind ``eager``: it scores the text in one
    forward (all positions' logits) instead of one step per token, which on a large eager quantized
    model (weights dequantized on every call) is most of the gate's time."""
    traces = [greedy(eager, p, steps) for p in prompts]
    scored = score(eager, reference.ids) if model is None else full_logits(model, reference.ids)
    return EagerRun([list(p) for p in prompts], traces, scored)


def full_logits(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """Next-token logits [len(ids) - 1, V] of a ``Transformer`` in one prefill from position 0."""
    with torch.no_grad():
        logits = model(torch.tensor([list(ids)]), torch.tensor([0]))[0, :-1].float()
    model.reset_cache()  # type: ignore[operator]
    return logits


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
    artifact: Stepper, prompts: Sequence[Sequence[int]], traces: Sequence[Trace]
) -> dict[str, Any]:
    """Eager decodes greedily; the artifact follows the same tokens, so logits are compared on the
    same contexts and a mismatch in argmax is a greedy divergence at that step.

    A mismatch is *at a tie* when eager's own top-2 margin is no larger than twice the artifact's
    logit error at that step: logits within e of each other can only swap an argmax whose margin
    is below 2e, so such a flip says nothing the logit tolerance does not already bound. Every other
    mismatch fails the gate. Both counts are reported."""
    per_prompt: list[dict[str, Any]] = []
    steps = len(traces[0].tokens)
    for prompt, ref in zip(prompts, traces, strict=True):
        got = follow(artifact, prompt, ref.tokens)
        diff = (got - ref.logits).abs().amax(-1)  # [steps]
        top2 = ref.logits.topk(2, -1).values
        margin = top2[:, 0] - top2[:, 1]
        mismatched = (got.argmax(-1) != torch.tensor(ref.tokens)).nonzero().flatten().tolist()
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
                "eager_tokens": ref.tokens,
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
    artifact: Stepper, eager: EagerRun, reference: Reference, settings: ValidationSettings
) -> dict[str, Any]:
    """All figures plus ``failures`` (empty when every threshold is met)."""
    vs_eager = compare_greedy(artifact, eager.prompts, eager.traces)
    fp32_ppl = perplexity_of(reference)
    artifact_fig = distribution_figures(score(artifact, reference.ids), reference)
    eager_fig = distribution_figures(eager.scored, reference)
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
