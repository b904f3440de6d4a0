"""SmolLM3: the Llama decoder where every ``no_rope_layer_interval``-th layer applies no RoPE
(``no_rope_layers[i] == 0``)."""

from __future__ import annotations

from ..args import ModelArgs
from .base import ConfigReader, Family, build_args, decoder_fields


def read_smollm3(reader: ConfigReader) -> ModelArgs:
    reader.expect("hidden_act", "silu")
    use_sliding = reader.flag("use_sliding_window")
    reader.get("sliding_window")  # in effect only through layer_types, and only when use_sliding_window
    fields = decoder_fields(reader)
    if not use_sliding:
        fields["layer_windows"] = ()
    flags = reader.get("no_rope_layers")
    reader.get("no_rope_layer_interval")  # spelled out by no_rope_layers
    if flags is None:
        flags = [1] * fields["n_layers"]
    if not isinstance(flags, list) or len(flags) != fields["n_layers"] or any(f not in (0, 1) for f in flags):
        raise reader.fail(f"no_rope_layers must list 0 or 1 for each of the {fields['n_layers']} layers")
    nope = tuple(i for i, use in enumerate(flags) if not use)
    return build_args(reader, **fields, attention_bias=reader.flag("attention_bias"), nope_layers=nope)


SMOLLM3 = Family("smollm3", ("SmolLM3ForCausalLM",), read_smollm3)
