"""Recipe quantization -> torchao configs applied with ``quantize_``. No quantization math lives here:
we only choose torchao schemes and which modules they apply to."""

from __future__ import annotations

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


def quantize_model(model: Transformer, quant: Quantization) -> Transformer:
    """Quantize in place: every linear layer (the output projection included) and the embedding."""
    if quant.linear is None and quant.embedding is None:
        return model
    untie_embeddings(model)
    quantize_embedding(model, quant.embedding)
    quantize_linears(model, quant.linear)
    return model
