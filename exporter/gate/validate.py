"""The validation gate: an artifact, run in its own runtime, against the eager model it came from
(same quantization) and against eager fp32. Thresholds come from the recipe."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from backends import Stepper

from ..model.head import head_parts
from ..model.transformer import Transformer
from ..plumbing.memory import release_memory
from ..recipe import ValidationSettings
from .steppers import Trace, follow, greedy, score


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
            logits = model.finish_logits(head_product(model.output, h[0])).float()
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


def head_product(head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``head(x)``, each of its linears blockwise (a split head's logits put back in vocabulary order)."""
    linears, place = head_parts(head)
    out = torch.cat([blockwise_linear(linear, x) for linear in linears], -1)
    return out if place is None else out.index_select(-1, place)


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


def distribution_figures(logits: torch.Tensor, ref: Reference, clear_margin: float) -> dict[str, Any]:
    """Perplexity, mean KL(fp32 || candidate) per token, and top-1 agreement with fp32: over every
    position, and over the *clear* ones, where fp32's own top-2 logit margin is at least
    ``clear_margin`` (elsewhere fp32 has no favourite for a candidate to agree with)."""
    targets = torch.tensor(ref.ids[1:])
    nll = F.cross_entropy(logits, targets).item()
    agree = logits.argmax(-1) == ref.logits.argmax(-1)
    clear = top2_margin(ref.logits) >= clear_margin
    return {
        "perplexity": math.exp(nll),
        "top1_agreement": agree.float().mean().item(),
        # None (JSON null) where fp32 has no clear position at all, e.g. random weights
        "top1_agreement_clear": agree[clear].float().mean().item() if clear.any() else None,
        "clear_positions": int(clear.sum()),
        "mean_kl": mean_kl(ref.logits, logits),
    }


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """[N, V] -> [N]: the gap between the largest and the second largest logit."""
    top2 = logits.topk(2, -1).values
    return top2[:, 0] - top2[:, 1]


def mean_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """Mean KL(p || q) per position, in nats."""
    p, q = F.log_softmax(p_logits.float(), -1), F.log_softmax(q_logits.float(), -1)
    return F.kl_div(q, p, log_target=True, reduction="batchmean").item()


def logit_error(candidate: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """[N, V] -> [N]: the largest |candidate - ref| over the vocabulary, in units of ref's logit
    spread (its standard deviation over the vocabulary) at that position. Scale-free: a model
    whose logits span 40 and one whose logits span 4 are held to the same standard."""
    spread = ref.float().std(-1).clamp_min(1e-6)
    return (candidate.float() - ref.float()).abs().amax(-1) / spread


def all_finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def perplexity_of(ref: Reference) -> float:
    return math.exp(F.cross_entropy(ref.logits, torch.tensor(ref.ids[1:])).item())


def compare_greedy(
    artifact: Stepper, eager: Teacher, prompts: Sequence[Sequence[int]], steps: int, tie_margin: float
) -> dict[str, Any]:
    """The artifact decodes greedily in its runtime; eager is run teacher-forced on the same tokens,
    so logits are compared on the same contexts and an argmax mismatch at a step is where a greedy
    decode by eager would have diverged.

    A mismatch is *at a tie* when eager's own top-2 margin is below ``tie_margin``, a constant of
    the recipe: there eager itself has no favourite. The artifact's measured error plays no part,
    so a real divergence always fails. Every other mismatch fails the gate. Both are reported."""
    runs = [greedy(artifact, p, steps) for p in prompts]
    return compare_runs(runs, eager, prompts, steps, tie_margin)


def compare_runs(
    runs: Sequence[Trace],
    eager: Teacher,
    prompts: Sequence[Sequence[int]],
    steps: int,
    tie_margin: float,
) -> dict[str, Any]:
    """``compare_greedy`` on greedy runs the artifact has already made."""
    per_prompt: list[dict[str, Any]] = []
    for prompt, run in zip(prompts, runs, strict=True):
        ref = eager([*prompt, *run.tokens[:-1]])[len(prompt) - 1 :]  # [steps, V]
        finite = all_finite(run.logits)
        diff = (run.logits - ref).abs().amax(-1)  # [steps]
        margin = top2_margin(ref)
        mismatched = (ref.argmax(-1) != torch.tensor(run.tokens)).nonzero().flatten().tolist()
        ties = [i for i in mismatched if margin[i] < tie_margin]
        per_prompt.append(
            {
                "prompt_tokens": len(prompt),
                "finite": finite,
                "greedy_tokens_identical": mismatched[0] if mismatched else steps,
                "mismatches_at_ties": [
                    {"step": i, "eager_margin": margin[i].item(), "logit_abs_diff": diff[i].item()}
                    for i in ties
                ],
                "mismatches_not_at_ties": [
                    {"step": i, "eager_margin": margin[i].item(), "logit_abs_diff": diff[i].item()}
                    for i in mismatched
                    if i not in ties
                ],
                "max_logit_abs_diff": diff.max().item(),
                "max_logit_error": logit_error(run.logits, ref).max().item(),
                "mean_kl": mean_kl(ref, run.logits),
                "artifact_tokens": run.tokens,
            }
        )
    return {
        "steps": steps,
        "tie_margin": tie_margin,
        "finite": all(p["finite"] for p in per_prompt),
        "greedy_tokens_identical_min": min(p["greedy_tokens_identical"] for p in per_prompt),
        "mismatches_not_at_ties": sum(len(p["mismatches_not_at_ties"]) for p in per_prompt),
        "mismatches_at_ties": sum(len(p["mismatches_at_ties"]) for p in per_prompt),
        "max_logit_abs_diff": max(p["max_logit_abs_diff"] for p in per_prompt),
        "max_logit_error": max(p["max_logit_error"] for p in per_prompt),
        "mean_kl": sum(p["mean_kl"] for p in per_prompt) / len(per_prompt),
        "prompts": per_prompt,
    }


def _worst(*values: float) -> float:
    """The largest value, NaN if any is NaN (``max`` would hide it)."""
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def gate_failures(figures: dict[str, Any], settings: ValidationSettings) -> list[str]:
    """What the figures miss of the recipe's thresholds; each message names the key. Comparisons
    are written so that NaN fails them."""
    vs_eager, vs_fp32 = figures["vs_eager"], figures["vs_fp32"]
    art = vs_fp32["artifact"]
    failures = []
    if not (vs_eager["finite"] and vs_fp32["artifact_finite"]):
        failures.append("the artifact produced NaN or Inf logits")
    if vs_eager["mismatches_not_at_ties"]:
        failures.append(
            f"{vs_eager['mismatches_not_at_ties']} greedy token(s) differ from eager where eager's "
            f"top-2 margin is >= validation.tie_margin {settings.tie_margin} (first divergence after "
            f"{vs_eager['greedy_tokens_identical_min']} of {settings.greedy_steps} steps)"
        )
    error = _worst(vs_eager["max_logit_error"], vs_eager["heldout_max_logit_error"])
    if not error <= settings.max_logit_error:
        failures.append(
            f"logit error vs eager {error:.4g} x eager's logit spread > "
            f"validation.max_logit_error {settings.max_logit_error:.4g}"
        )
    kl = _worst(vs_eager["mean_kl"], vs_eager["heldout_mean_kl"])
    if not kl <= settings.max_kl_vs_eager:
        failures.append(
            f"KL(eager || artifact) {kl:.4g} nats/token > "
            f"validation.max_kl_vs_eager {settings.max_kl_vs_eager:.4g}"
        )
    agreement = art["top1_agreement_clear"]
    if art["clear_positions"] and not agreement >= settings.min_top1_agreement:
        failures.append(
            f"top-1 agreement with fp32 {agreement:.4f} where fp32's margin >= {settings.clear_margin} "
            f"({art['clear_positions']} positions) < "
            f"validation.min_top1_agreement {settings.min_top1_agreement}"
        )
    ratio = vs_fp32["perplexity_ratio"]
    if not ratio <= settings.max_perplexity_ratio:
        failures.append(
            f"perplexity ratio to fp32 {ratio:.4f} > "
            f"validation.max_perplexity_ratio {settings.max_perplexity_ratio}"
        )
    return failures


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
    vs_eager = compare_runs(runs, eager, prompts, settings.greedy_steps, settings.tie_margin)
    eager_logits = eager(reference.ids)[:-1]
    vs_eager["heldout_max_logit_error"] = logit_error(artifact_logits, eager_logits).max().item()
    vs_eager["heldout_mean_kl"] = mean_kl(eager_logits, artifact_logits)
    fp32_ppl = perplexity_of(reference)
    artifact_fig = distribution_figures(artifact_logits, reference, settings.clear_margin)
    eager_fig = distribution_figures(eager_logits, reference, settings.clear_margin)
    figures: dict[str, Any] = {
        "thresholds": dataclasses.asdict(settings),
        "vs_eager": vs_eager,
        "vs_fp32": {
            "eval_tokens": len(reference.ids) - 1,
            "fp32_perplexity": fp32_ppl,
            "artifact_finite": all_finite(artifact_logits),
            "artifact": artifact_fig,
            "eager_quantized": eager_fig,
            "perplexity_ratio": artifact_fig["perplexity"] / fp32_ppl,
        },
    }
    # How much the runtime adds to what quantization itself costs (KL from fp32), on the same text:
    # for a quantized recipe the yardstick that says whether a vs-eager gap matters.
    quant_kl = eager_fig["mean_kl"]
    figures["vs_eager"]["heldout_kl_share_of_quantization"] = (
        vs_eager["heldout_mean_kl"] / quant_kl if quant_kl > 1e-9 else None
    )
    failures = gate_failures(figures, settings)
    return {"passed": not failures, "failures": failures, **figures}
