"""Qwen2/2.5 (q/k/v bias always) and Qwen3 (per-head q/k RMSNorm, explicit ``head_dim``)."""

from __future__ import annotations

from ..args import ModelArgs
from .base import ConfigReader, Family, build_args, decoder_fields


def _read(reader: ConfigReader, qwen3: bool) -> ModelArgs:
    reader.expect("hidden_act", "silu")
    # max_window_layers and sliding_window take effect through layer_types, which transformers
    # derives from them (all "full_attention" while use_sliding_window is false).
    reader.get("max_window_layers")
    use_sliding = reader.flag("use_sliding_window")
    reader.get("sliding_window")  # in effect only through layer_types, and only when use_sliding_window
    fields = decoder_fields(reader)
    if not use_sliding:
        fields["layer_windows"] = ()
    elif reader.get("layer_types") is None:
        raise reader.fail(
            "use_sliding_window without layer_types (write the config with transformers >= 4.53)"
        )
    return build_args(
        reader,
        **fields,
        attention_bias=not qwen3 or reader.flag("attention_bias"),
        qk_norm="head" if qwen3 else "",
    )


def read_qwen2(reader: ConfigReader) -> ModelArgs:
    return _read(reader, qwen3=False)


def read_qwen3(reader: ConfigReader) -> ModelArgs:
    return _read(reader, qwen3=True)


QWEN2 = Family("qwen2", ("Qwen2ForCausalLM",), read_qwen2)
QWEN3 = Family("qwen3", ("Qwen3ForCausalLM",), read_qwen3)
