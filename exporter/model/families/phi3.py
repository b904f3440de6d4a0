"""Phi-3 / Phi-3.5 / Phi-4-mini: fused ``qkv_proj`` and ``gate_up_proj`` (split by rows at load),
partial rotary (Phi-4-mini rotates 3/4 of each head), LongRoPE factors, an optional sliding window
over every layer."""

from __future__ import annotations

import math

from ..args import LongRopeScaling, ModelArgs
from .base import ConfigReader, Family, build_args, decoder_fields, rope_parameters


def _long_rope(reader: ConfigReader, params: dict[str, object], rotary_dim: int) -> LongRopeScaling:
    sub = ConfigReader(reader.file, params)
    factors = {}
    for key in ("short_factor", "long_factor"):
        value = sub.get(key)
        if (
            not isinstance(value, list)
            or len(value) != rotary_dim // 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)
        ):
            raise reader.fail(f"rope_parameters.{key} must list {rotary_dim // 2} positive numbers")
        factors[key] = tuple(float(v) for v in value)
    original = reader.positive(
        "original_max_position_embeddings", int, params.get("original_max_position_embeddings")
    )
    sub.get("original_max_position_embeddings")
    factor = sub.get("factor") or reader.positive("max_position_embeddings", int) / original
    attention_factor = sub.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return LongRopeScaling(factors["short_factor"], factors["long_factor"], original, float(attention_factor))


def read_phi3(reader: ConfigReader) -> ModelArgs:
    reader.expect("hidden_act", "silu")
    reader.expect("attention_bias", False)
    params = rope_parameters(reader)["full_attention"]
    partial = params.get("partial_rotary_factor", reader.get("partial_rotary_factor", 1.0))
    longrope = params.get("rope_type", params.get("type")) in ("longrope", "su")
    core = {k: v for k, v in params.items() if k not in ("partial_rotary_factor",)}
    if longrope:  # read below; decoder_fields sees a default RoPE of the same base
        core = {"rope_theta": params.get("rope_theta", reader.get("rope_theta", 10000.0))}
    fields = decoder_fields(reader, core)
    if not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise reader.fail(f"partial_rotary_factor must be in (0, 1], got {partial!r}")
    rotary_dim = int(fields["head_dim"] * partial)
    if longrope:
        fields["rope_scaling"] = _long_rope(reader, params, rotary_dim)
    else:
        reader.get("original_max_position_embeddings")  # used by LongRoPE only
    window = reader.get("sliding_window")
    if window is not None:
        fields["layer_windows"] = (reader.positive("sliding_window", int),) * fields["n_layers"]
    return build_args(reader, **fields, rotary_dim=0 if rotary_dim == fields["head_dim"] else rotary_dim)


PHI3 = Family(
    "phi3",
    ("Phi3ForCausalLM",),
    read_phi3,
    fused={
        "self_attn.qkv_proj": ("attention.wq", "attention.wk", "attention.wv"),
        "mlp.gate_up_proj": ("feed_forward.w1", "feed_forward.w3"),
    },
)
