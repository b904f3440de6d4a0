"""Llama 2/3.x, SmolLM2, TinyLlama, Mistral and Ministral: the default decoder."""

from __future__ import annotations

from ..args import ModelArgs
from .base import ConfigReader, Family, build_args, decoder_fields


def read_llama(reader: ConfigReader) -> ModelArgs:
    reader.expect("hidden_act", "silu")
    return build_args(reader, **decoder_fields(reader), attention_bias=reader.flag("attention_bias"))


def read_mistral(reader: ConfigReader) -> ModelArgs:
    """Mistral's ``sliding_window`` (null in most releases) applies to every layer."""
    reader.expect("hidden_act", "silu")
    fields = decoder_fields(reader)
    window = reader.get("sliding_window")
    if window is not None and not fields["layer_windows"]:
        window = reader.positive("sliding_window", int)
        fields["layer_windows"] = (window,) * fields["n_layers"]
    return build_args(reader, **fields, attention_bias=reader.flag("attention_bias"))


LLAMA = Family("llama", ("LlamaForCausalLM",), read_llama)
MISTRAL = Family("mistral", ("MistralForCausalLM",), read_mistral)
