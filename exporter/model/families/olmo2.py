"""OLMo 2: norms after attention and MLP only, q/k RMSNorm over the whole projection."""

from __future__ import annotations

from ..args import ModelArgs
from .base import LLAMA_LAYER_KEYS, ConfigReader, Family, build_args, decoder_fields


def read_olmo2(reader: ConfigReader) -> ModelArgs:
    reader.expect("hidden_act", "silu")
    return build_args(
        reader,
        **decoder_fields(reader),
        attention_bias=reader.flag("attention_bias"),
        qk_norm="proj",
        norm_placement="post",
    )


_KEYS = {
    k: v for k, v in LLAMA_LAYER_KEYS.items() if k not in ("input_layernorm", "post_attention_layernorm")
}
OLMO2 = Family(
    "olmo2",
    ("Olmo2ForCausalLM",),
    read_olmo2,
    layer_keys={
        **_KEYS,
        "post_attention_layernorm": "post_attention_norm",
        "post_feedforward_layernorm": "post_ffn_norm",
    },
)
