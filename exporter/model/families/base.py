"""What every family reader shares: a ``config.json`` reader that remembers which fields it read (so
a field no reader knows is refused, never silently ignored), the Llama tensor names, RoPE parameters
in both the transformers-4 and -5 spellings, and the decoder fields all families have."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from ..args import LinearRopeScaling, ModelArgs, RopeScaling

# Fields that describe the file, the tokenizer's ids or training, never the forward pass.
HARMLESS = frozenset(
    {
        "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
        "initializer_range", "attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop",
        "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id",
        "id2label", "label2id", "return_dict", "output_attentions", "output_hidden_states",
        "chunk_size_feed_forward", "is_encoder_decoder", "problem_type", "tokenizer_class",
        "pretraining_tp", "torchscript", "cache_implementation", "max_position_embeddings",
    }
)  # fmt: skip

# Hugging Face name (after "model.layers.{i}.") -> ours (after "layers.{i}.")
LLAMA_LAYER_KEYS: Mapping[str, str] = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "self_attn.q_norm": "attention.q_norm",
    "self_attn.k_norm": "attention.k_norm",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}
TOP_KEYS: Mapping[str, str] = {
    "model.embed_tokens": "tok_embeddings",
    "model.norm": "norm",
    "lm_head": "output",
}
_NORM_WEIGHT = re.compile(r"(.*\.)?\w*norm\.weight")


class ConfigReader:
    """Typed access to one ``config.json``; every field asked for is remembered as known."""

    def __init__(self, file: Path, config: dict[str, Any]) -> None:
        self.file, self.config, self.known = file, config, set(HARMLESS)

    def fail(self, message: str) -> CheckpointError:
        return CheckpointError(self.file, message)

    def get(self, key: str, default: Any = None) -> Any:
        self.known.add(key)
        value = self.config.get(key)
        return default if value is None else value

    def typed(self, key: str, kind: type, default: Any = None) -> Any:
        value = self.get(key, default)
        if value is None:
            raise self.fail(f"required field {key!r} missing")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value) if abs(value) < 2**1023 else math.inf  # float() of a larger int raises
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(f"field {key!r} must be {kind.__name__}, got {value!r}")
        return value

    def positive(self, key: str, kind: type, default: Any = None) -> Any:
        """A size (int) or a scale (float): no model has a zero, negative, infinite or NaN one, nor a
        size that torch's 32-bit index arithmetic cannot hold."""
        value = self.typed(key, kind, default)
        if not (value > 0 and (value < 2**31 if kind is int else math.isfinite(value))):
            raise self.fail(f"field {key!r} must be a positive finite number, got {value!r}")
        return value

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if value is not None and not isinstance(value, bool):
            raise self.fail(f"field {key!r} must be true or false, got {value!r}")
        return bool(value)

    def expect(self, key: str, *allowed: Any) -> None:
        """The field is absent, null or one of ``allowed``: the only values our math implements."""
        value = self.get(key)
        if value is not None and value not in allowed:
            raise self.fail(f"unsupported {key}={value!r} (only {', '.join(repr(a) for a in allowed)})")

    def check_unknown(self, family: str) -> None:
        # null is "off" or "the default" for every field we have met; "_"-fields are file metadata.
        unknown = sorted(
            k
            for k, v in self.config.items()
            if k not in self.known and not k.startswith("_") and v is not None
        )
        if unknown:
            raise self.fail(
                f"field {unknown[0]!r} is unknown to the {family} reader and may change the model's math "
                "(refused, not ignored)"
            )


@dataclass(frozen=True)
class Family:
    """One family: the ``architectures`` it reads, its config reader and its tensor names."""

    name: str
    architectures: tuple[str, ...]
    read: Callable[[ConfigReader], ModelArgs]
    layer_keys: Mapping[str, str] = field(default_factory=lambda: LLAMA_LAYER_KEYS)
    # Gemma stores RMSNorm weights as w and multiplies by (1 + w): folded in at load, in fp32.
    norm_offset: float = 0.0
    # A stored module holding several of ours stacked by rows (Phi-3's qkv_proj), in row order.
    fused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def is_norm(self, ours: str) -> bool:
        return bool(_NORM_WEIGHT.fullmatch(ours))


def rope(reader: ConfigReader, params: Any) -> tuple[float, RopeScaling | LinearRopeScaling | None]:
    """One set of RoPE parameters (``rope_type`` default, linear or llama3)."""
    if not isinstance(params, dict):
        raise reader.fail(f"rope_parameters must be a JSON object, got {params!r}")
    sub = ConfigReader(reader.file, params)
    theta = sub.positive("rope_theta", float)
    kind = sub.get("rope_type", sub.get("type", "default"))
    scaling: RopeScaling | LinearRopeScaling | None = None
    if kind == "linear":
        scaling = LinearRopeScaling(sub.positive("factor", float))
    elif kind == "llama3":
        try:
            scaling = RopeScaling(
                factor=sub.positive("factor", float),
                low_freq_factor=sub.positive("low_freq_factor", float),
                high_freq_factor=sub.positive("high_freq_factor", float),
                original_max_position_embeddings=sub.positive("original_max_position_embeddings", int),
            )
        except CheckpointError as e:
            raise reader.fail(f"llama3 rope scaling: {e.message}") from e
    elif kind != "default":
        raise reader.fail(f"unsupported rope type {kind!r} (supported: default, linear, llama3)")
    sub.check_unknown(f"{kind} rope")
    return theta, scaling


def rope_parameters(reader: ConfigReader) -> dict[str, Any]:
    """transformers >= 5 writes ``rope_parameters`` (per layer type where they differ); older versions
    ``rope_theta`` + ``rope_scaling``. Returned per layer type: "full_attention" always."""
    params = reader.get("rope_parameters") or reader.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise reader.fail(f"rope_parameters must be a JSON object, got {params!r}")
    if "full_attention" in params:
        return params
    return {"full_attention": {"rope_theta": reader.get("rope_theta", 10000.0), **params}}


def layer_windows(reader: ConfigReader, n_layers: int) -> tuple[int, ...]:
    """Per-layer windows from ``layer_types`` (transformers 5 writes it for every family that has
    sliding layers, all "full_attention" where the sliding window is off)."""
    types = reader.get("layer_types")
    if types is None:
        return ()
    if not isinstance(types, list) or len(types) != n_layers:
        raise reader.fail(f"layer_types must list {n_layers} layer types")
    bad = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if bad:
        raise reader.fail(f"unsupported layer type {bad[0]!r} (supported: full_attention, sliding_attention)")
    if "sliding_attention" not in types:
        return ()
    window = reader.positive("sliding_window", int)
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def decoder_fields(reader: ConfigReader, rope_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``ModelArgs`` fields every family spells the same way (``rope_params``: the global
    layers' RoPE parameters where the family reads them itself)."""
    reader.expect("mlp_bias", False)
    dim = reader.positive("hidden_size", int)
    n_heads = reader.positive("num_attention_heads", int)
    if reader.get("head_dim") is not None:
        head_dim = reader.positive("head_dim", int)
    elif (head_dim := dim // n_heads) == 0:
        raise reader.fail(f"hidden_size {dim} is smaller than num_attention_heads {n_heads}")
    n_layers = reader.positive("num_hidden_layers", int)
    theta, scaling = rope(
        reader, rope_parameters(reader)["full_attention"] if rope_params is None else rope_params
    )
    return {
        "dim": dim,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_kv_heads": reader.positive("num_key_value_heads", int, n_heads),
        "head_dim": head_dim,
        "hidden_dim": reader.positive("intermediate_size", int),
        "vocab_size": reader.positive("vocab_size", int),
        "norm_eps": reader.positive("rms_norm_eps", float, 1e-6),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": reader.flag("tie_word_embeddings"),
        "max_position_embeddings": reader.positive("max_position_embeddings", int, 2048),
        "layer_windows": layer_windows(reader, n_layers),
    }


def build_args(reader: ConfigReader, **fields: Any) -> ModelArgs:
    try:
        return ModelArgs(**fields)
    except ValueError as e:
        raise reader.fail(str(e)) from e
