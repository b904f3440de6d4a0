"""Recipe quantization -> torchao configs applied with ``quantize_``. No quantization math lives here:
we only choose torchao schemes and which modules they apply to."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import nn

from ..model.head import linear_of
from ..model.transformer import Transformer
from ..recipe import EmbeddingQuant, LinearQuant, Quantization


def linear_config(q: LinearQuant) -> object:
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quantize_.workflows import IntxChooseQParamsAlgorithm

    if q.scheme == "int4_weight_only":
        return _int4_cpu_config(q)
    if q.scheme == "8da8w":
        # One scale per output channel, which XNNPACK stores in fp32 (only group-wise scales are
        # narrowed to bf16), so fp32 scales here are what the .pte computes with.
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4,  # type: ignore[attr-defined]
        weight_granularity=PerGroup(q.group_size),
        intx_choose_qparams_algorithm=IntxChooseQParamsAlgorithm(q.scale_algorithm),
        # ExecuTorch's XNNPACK serializer stores group-wise scales as bf16 (executorch 1.5.1,
        # backends/xnnpack/operators/node_visitor.py, get_quant_params). With fp32 scales the eager
        # model the gate compares against is not the model the .pte computes: 2% of the int4 error
        # in every linear, compounding over 30 layers into greedy divergences (SmolLM2-135M). With
        # bf16 scales chosen here, the cast there is exact and the two agree to fp32 rounding.
        weight_scale_dtype=torch.bfloat16,
    )


def _int4_cpu_config(q: LinearQuant) -> object:
    # The int4 path that is real on x86 with torchao 0.18 (see the AOTI backend's notes): weights
    # packed for aten._weight_int4pack_mm_for_cpu, bf16 activations. Inductor settings stay in the
    # backend, so torchao must not set them globally here.
    from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
    from torchao.quantization.quantize_.workflows import Int4ChooseQParamsAlgorithm

    algorithm = {"affine": "tinygemm", "hqq": "hqq"}[q.scale_algorithm]
    return PrototypeInt4WeightOnlyConfig(
        group_size=q.group_size,
        int4_choose_qparams_algorithm=Int4ChooseQParamsAlgorithm(algorithm),
        set_inductor_config=False,
    )


def _embedding_config(q: EmbeddingQuant) -> object:
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    dtype = {4: torch.int4, 8: torch.int8}[q.bits]  # type: ignore[attr-defined]
    return IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerGroup(q.group_size))


def untie_embeddings(model: Transformer) -> Transformer:
    """Give the output projection its own weight so embedding and head can be quantized apart."""
    if model.output.weight is model.tok_embeddings.weight:
        model.output.weight = nn.Parameter(model.tok_embeddings.weight.detach().clone())
    return model


# Elements per block of rows: 2 MB of fp32, so each pass of a scale search (HQQ makes 20 over the
# weight) runs in cache instead of streaming the whole tensor from memory. Measured on a 1B model's
# [8192, 2048] projection: 4.3 s whole, 0.3 s in blocks (same codes and scales on that weight).
BLOCK_ELEMENTS = 1 << 19


def _apply(module: nn.Module, config: object, kind: type[nn.Module]) -> None:
    from torchao.quantization import quantize_

    quantize_(module, config, filter_fn=lambda m, _fqn: isinstance(m, kind))  # type: ignore[arg-type]


def quantize_linears(
    module: nn.Module,
    q: LinearQuant | None,
    dtype: torch.dtype | None = None,
    plan: Mapping[str, LinearQuant] | None = None,
) -> nn.Module:
    """Quantize every ``nn.Linear`` in ``module`` (which may be one layer, or the head alone), each a
    block of rows at a time, its weight cast to ``dtype`` (None: kept) block by block. ``plan``
    gives some linears (by name within ``module``) another precision than ``q``."""
    if q is not None:
        for name, linear in [(n, m) for n, m in module.named_modules() if isinstance(m, nn.Linear)]:
            chosen = (plan or {}).get(name, q)
            config = linear_config(chosen)
            if chosen.scheme == "int4_weight_only":  # packed for the CPU int4 kernel: no row blocks
                linear.weight = nn.Parameter(linear.weight.detach().to(dtype or linear.weight.dtype), False)
                _apply(linear, config, nn.Linear)
            else:
                quantize_rows(
                    linear,
                    functools.partial(_apply, config=config, kind=nn.Linear),
                    dtype or linear.weight.dtype,
                )
    return module


def quantized_weight(weight: torch.Tensor, q: LinearQuant) -> torch.Tensor:
    """``weight`` [out, in] quantized by torchao at precision ``q`` (a tensor subclass)."""
    linear = linear_of(weight.detach())
    quantize_linears(linear, q)
    return cast(torch.Tensor, linear.weight).detach()


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """A torchao weight back in fp32 (torchao's own dequantize)."""
    plain = weight.dequantize() if hasattr(weight, "dequantize") else weight
    return plain.float()


def stored_bytes_estimate(shape: torch.Size, q: LinearQuant) -> float:
    """Bytes an XNNPACK program stores for a [out, in] linear weight at precision ``q``: packed
    int4 plus a bf16 scale per group, or int8 plus an fp32 scale per output channel."""
    out_features, in_features = shape
    if q.scheme == "8da8w":
        return out_features * (in_features + 4)
    bits = 4 if q.scheme in ("8da4w", "int4_weight_only") else 8
    return out_features * in_features * (bits / 8 + 2 / q.group_size)


def quantize_embedding(
    module: nn.Module, q: EmbeddingQuant | None, dtype: torch.dtype | None = None
) -> nn.Module:
    if q is not None:
        config = _embedding_config(q)
        for emb in [m for m in module.modules() if isinstance(m, nn.Embedding)]:
            quantize_rows(emb, lambda m: _apply(m, config, nn.Embedding), dtype or emb.weight.dtype)
    return module


def quantize_rows(
    module: nn.Linear | nn.Embedding,
    quantize: Callable[[nn.Module], object],
    dtype: torch.dtype,
    rows: int | None = None,
) -> None:
    """Cast ``module``'s weight to ``dtype`` and quantize it, a block of ``rows`` output rows at a time
    (None: as many as make ``BLOCK_ELEMENTS``).

    torchao's group-wise schemes quantize each row's groups on their own, so the blocks, joined,
    are the tensor a whole-weight call gives, up to one coupling: HQQ stops early once the largest
    change of any scale in the call is below 1e-5, so a block can stop a few iterations before the
    whole would, at that tolerance (``tests/test_quantize.py`` finds them equal on its weight).
    Meanwhile the transient fp32 copies and the scale search stay the size of one block, in cache:
    quantizing a 1B model's [128256, 2048] head at once takes 4 GB besides the weight. A scheme
    whose tensor is not ``IntxUnpackedToInt8Tensor`` with one scale row per weight row is
    quantized whole."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    weight = module.weight.detach()
    rows = rows or max(1, BLOCK_ELEMENTS // weight.shape[1])
    parts = ("qdata", "scale", "zero_point")
    whole: IntxUnpackedToInt8Tensor | None = None
    for start in range(0, weight.shape[0], rows):
        piece = _like(module, weight[start : start + rows].to(dtype))
        quantize(piece)
        got = piece.weight
        n = min(rows, weight.shape[0] - start)
        if not isinstance(got, IntxUnpackedToInt8Tensor) or any(getattr(got, p).shape[0] != n for p in parts):
            module.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
            quantize(module)
            return
        if whole is None:
            # Each block is written into tensors of the whole weight's size, allocated once, rather
            # than kept in a list and joined: half the transient memory, and no heap left strewn
            # with thousands of long-lived small blocks.
            whole = IntxUnpackedToInt8Tensor(
                *(getattr(got, p).new_empty((weight.shape[0], *getattr(got, p).shape[1:])) for p in parts),
                got.target_dtype,
                got.block_size,
                got.dtype,
                got.activation_quantization,
            )
        for p in parts:
            getattr(whole, p)[start : start + n].copy_(getattr(got, p))
    assert whole is not None  # a weight has at least one row
    module.weight = nn.Parameter(whole, requires_grad=False)


def _like(module: nn.Linear | nn.Embedding, weight: torch.Tensor) -> nn.Module:
    if not isinstance(module, nn.Embedding):
        return linear_of(weight)
    with torch.device("meta"):
        piece = nn.Embedding(weight.shape[0], weight.shape[1])
    piece.weight = nn.Parameter(weight, requires_grad=False)
    return piece


def quantize_model(model: Transformer, quant: Quantization) -> Transformer:
    """Quantize in place: every linear layer (the output projection included) and the embedding."""
    if quant.linear is None and quant.embedding is None:
        return model
    untie_embeddings(model)
    quantize_embedding(model, quant.embedding)
    quantize_linears(model, quant.linear)
    return model


def describe_weight(weight: torch.Tensor) -> str:
    """How a weight is stored, in words: the manifest's precision map."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    if isinstance(weight, IntxUnpackedToInt8Tensor):
        bits = {torch.int4: 4, torch.int8: 8}.get(weight.target_dtype, weight.target_dtype)  # type: ignore[attr-defined]
        group = weight.block_size[-1]
        grouping = "per-channel" if group == weight.shape[-1] else f"g{group}"
        acts = "int8 dynamic activations" if weight.activation_quantization else "weight-only"
        scale = str(weight.scale.dtype).removeprefix("torch.")
        return f"int{bits} {grouping} {acts}, {scale} scales"
    if type(weight) in (torch.Tensor, nn.Parameter):
        return str(weight.dtype).removeprefix("torch.")
    return type(weight).__name__


def precision_map(model: nn.Module) -> dict[str, Any]:
    """Every linear and embedding weight's precision, and a count per precision."""
    by_tensor: dict[str, str] = {}
    summary: dict[str, dict[str, int]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            label = describe_weight(module.weight)
            by_tensor[f"{name}.weight"] = label
            entry = summary.setdefault(label, {"tensors": 0, "parameters": 0})
            entry["tensors"] += 1
            entry["parameters"] += module.weight.numel()
    return {"summary": summary, "by_tensor": by_tensor}
