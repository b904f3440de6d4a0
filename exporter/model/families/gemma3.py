"""Gemma 3 (text): sandwich norms stored as w for (1 + w), per-head q/k norm, GELU-tanh, embeddings
scaled by sqrt(E), attention scaled by ``query_pre_attn_scalar``, five sliding-window layers (10k
RoPE base) for each global one (1M base, linearly scaled from 4B up)."""

from __future__ import annotations

import math

from ..args import ModelArgs
from .base import LLAMA_LAYER_KEYS, ConfigReader, Family, build_args, decoder_fields, rope, rope_parameters


def read_gemma3(reader: ConfigReader) -> ModelArgs:
    reader.expect("hidden_activation", "gelu_pytorch_tanh")
    reader.expect("hidden_act", "gelu_pytorch_tanh")
    reader.expect("attention_bias", False)
    reader.expect("use_bidirectional_attention", False)
    reader.expect("attn_logit_softcapping", None)
    fields = decoder_fields(reader)
    params = rope_parameters(reader)
    if "sliding_attention" in params:
        local_theta, local_scaling = rope(reader, params["sliding_attention"])
        if local_scaling is not None:
            raise reader.fail("rope_parameters.sliding_attention: only the default rope type is supported")
    else:  # transformers 4 spelling
        local_theta = reader.positive("rope_local_base_freq", float, 10000.0)
    reader.get("sliding_window_pattern")  # spelled out by layer_types
    if not reader.config.get("layer_types"):
        raise reader.fail("required field 'layer_types' missing (written by transformers >= 4.53)")
    cap = reader.get("final_logit_softcapping")
    return build_args(
        reader,
        **fields,
        qk_norm="head",
        norm_placement="sandwich",
        activation="gelu_tanh",
        local_rope_theta=local_theta,
        embedding_scale=math.sqrt(fields["dim"]),
        attention_scale=reader.positive("query_pre_attn_scalar", float) ** -0.5,
        final_logit_softcap=None if cap is None else reader.positive("final_logit_softcapping", float),
    )


GEMMA3 = Family(
    "gemma3",
    ("Gemma3ForCausalLM",),
    read_gemma3,
    layer_keys={
        **LLAMA_LAYER_KEYS,
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffn_norm",
    },
    norm_offset=1.0,
)
