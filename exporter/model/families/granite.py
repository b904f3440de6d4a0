"""Granite 3.x: the Llama decoder with four multipliers (embedding, attention, residual, logits)."""

from __future__ import annotations

from ..args import ModelArgs
from .base import ConfigReader, Family, build_args, decoder_fields


def read_granite(reader: ConfigReader) -> ModelArgs:
    reader.expect("hidden_act", "silu")
    return build_args(
        reader,
        **decoder_fields(reader),
        attention_bias=reader.flag("attention_bias"),
        embedding_scale=reader.positive("embedding_multiplier", float, 1.0),
        attention_scale=reader.positive("attention_multiplier", float),
        residual_multiplier=reader.positive("residual_multiplier", float, 1.0),
        logit_scale=1.0 / reader.positive("logits_scaling", float, 1.0),
    )


GRANITE = Family("granite", ("GraniteForCausalLM",), read_granite)
