"""Recipe quantization -> torchao configs applied with ``quantize_``. No quantization math lives here:
we only choose torchao schemes and which modules they apply to."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .model import Transformer
from .recipe import EmbeddingQuant, LinearQuant, Quantization


def _linear_config(q: LinearQuant) -> object:
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quantize_.workflows import IntxChooseQParamsAlgorithm

    if q.scheme == "int4_weight_only":
        return _int4_cpu_config(q)
    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4,  # type: ignore[attr-defined]
        weight_granularity=PerGroup(q.group_size),
        intx_choose_qparams_algorithm=IntxChooseQParamsAlgorithm(q.scale_algorithm),
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


def quantize_linears(module: nn.Module, q: LinearQuant | None) -> nn.Module:
    """Quantize every ``nn.Linear`` in ``module`` (which may be one layer, or the head alone)."""
    from torchao.quantization import quantize_

    if q is not None:
        quantize_(
            module,
            _linear_config(q),  # type: ignore[arg-type]
            filter_fn=lambda m, _fqn: isinstance(m, nn.Linear),
        )
    return module


def quantize_embedding(module: nn.Module, q: EmbeddingQuant | None) -> nn.Module:
    from torchao.quantization import quantize_

    if q is not None:
        quantize_(
            module,
            _embedding_config(q),  # type: ignore[arg-type]
            filter_fn=lambda m, _fqn: isinstance(m, nn.Embedding),
        )
    return module


def quantize_rows(
    module: nn.Linear | nn.Embedding,
    quantize: Callable[[nn.Module], object],
    dtype: torch.dtype,
    rows: int = 8192,
) -> None:
    """Cast ``module``'s weight to ``dtype`` and quantize it, a block of ``rows`` output rows at a time.

    torchao's group-wise schemes quantize each row's groups on their own, so the blocks, joined,
    are the tensor a whole-weight call gives (``tests/test_quantize.py`` checks it), while the
    transient fp32 copies and the scale search stay the size of one block: quantizing a 1B model's
    [128256, 2048] head at once takes 4 GB besides the weight. A scheme whose tensor is not
    ``IntxUnpackedToInt8Tensor`` (the packed int4 server layout) is quantized whole."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    weight = module.weight.detach()
    pieces: list[IntxUnpackedToInt8Tensor] = []
    for start in range(0, weight.shape[0], rows):
        piece = _like(module, weight[start : start + rows].to(dtype))
        quantize(piece)
        if not isinstance(piece.weight, IntxUnpackedToInt8Tensor):
            module.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
            quantize(module)
            return
        pieces.append(piece.weight)
    first = pieces[0]
    module.weight = nn.Parameter(
        IntxUnpackedToInt8Tensor(
            torch.cat([p.qdata for p in pieces]),
            torch.cat([p.scale for p in pieces]),
            torch.cat([p.zero_point for p in pieces]),
            first.target_dtype,
            first.block_size,
            first.dtype,
            first.activation_quantization,
        ),
        requires_grad=False,
    )


def _like(module: nn.Linear | nn.Embedding, weight: torch.Tensor) -> nn.Module:
    with torch.device("meta"):
        if isinstance(module, nn.Embedding):
            piece: nn.Module = nn.Embedding(weight.shape[0], weight.shape[1])
        else:
            piece = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
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
