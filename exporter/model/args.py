"""The model's architecture as plain values: no torch, so recipes and the build plan can check and
key a build without importing it. ``exporter.model.transformer`` re-exports both names.

Families differ by named, orthogonal features (per-layer attention window and RoPE base, norm
placement, q/k norm scope, activation, multipliers); each family's reader in ``families/`` says which
of them its ``config.json`` turns on. The defaults are the Llama decoder."""

from __future__ import annotations

from dataclasses import dataclass

NORM_PLACEMENTS = ("pre", "sandwich", "post")  # Llama; Gemma 2/3; OLMo 2
QK_NORMS = ("", "head", "proj")  # none; per head (Qwen3, Gemma 3); over the whole projection (OLMo 2)
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (``rope_scaling.rope_type == "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LinearRopeScaling:
    """Positions divided by ``factor`` (``rope_type == "linear"``; Gemma 3's global layers, 4B and up)."""

    factor: float


@dataclass(frozen=True)
class LongRopeScaling:
    """Phi-3's LongRoPE: per-frequency divisors, the short ones up to the pretraining length and the
    long ones beyond it (chosen by the cache length: transformers switches once a sequence outgrows
    ``original_max_position_embeddings``), and cos/sin scaled by ``attention_factor``."""

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    attention_factor: float


@dataclass(frozen=True)
class ModelArgs:
    """Architecture only: nothing here says how or where the model is exported."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    vocab_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | LinearRopeScaling | LongRopeScaling | None = None
    # RoPE on the first rotary_dim of each head only (Phi-4-mini: 3/4); 0: the whole head.
    rotary_dim: int = 0
    attention_bias: bool = False
    qk_norm: str = ""
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    # Per layer: 0 attends to every earlier position, W > 0 to the last W (itself included).
    # Empty: every layer global.
    layer_windows: tuple[int, ...] = ()
    # RoPE base of the sliding-window layers, unscaled (Gemma 3: 10k locally, 1M globally); None:
    # the same RoPE as the global layers.
    local_rope_theta: float | None = None
    # Layers that apply no rotary embedding at all (SmolLM3's every fourth).
    nope_layers: tuple[int, ...] = ()
    norm_placement: str = "pre"
    activation: str = "silu"
    embedding_scale: float = 1.0  # Gemma: sqrt(dim); Granite: embedding_multiplier
    attention_scale: float | None = None  # None: 1/sqrt(head_dim)
    residual_multiplier: float = 1.0  # Granite: each block's output scaled before the residual add
    logit_scale: float = 1.0  # Granite: 1 / logits_scaling
    final_logit_softcap: float | None = None  # Gemma 2: cap * tanh(logits / cap)

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        for name, value, allowed in (
            ("norm_placement", self.norm_placement, NORM_PLACEMENTS),
            ("qk_norm", self.qk_norm, QK_NORMS),
            ("activation", self.activation, ACTIVATIONS),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}")
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise ValueError(f"{len(self.layer_windows)} layer windows for {self.n_layers} layers")
        if any(w < 0 for w in self.layer_windows):
            raise ValueError(f"negative attention window in {self.layer_windows}")
        if not 0 <= self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ValueError(
                f"rotary_dim={self.rotary_dim} must be even and at most head_dim={self.head_dim}"
            )
        if any(not 0 <= i < self.n_layers for i in self.nope_layers):
            raise ValueError(f"no-RoPE layer index out of range in {self.nope_layers}")

    @property
    def rope_dim(self) -> int:
        """Dimensions of each head that RoPE rotates."""
        return self.rotary_dim or self.head_dim

    def window(self, layer: int) -> int:
        """Layer ``layer``'s attention window, 0 for global attention."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def cache_positions(self, max_seq_len: int) -> int:
        """Positions the KV caches hold, summed over layers: a sliding-window layer's ring holds
        min(window, max_seq_len), a global layer max_seq_len."""
        return sum(min(self.window(i) or max_seq_len, max_seq_len) for i in range(self.n_layers))

    def parameter_count(self) -> int:
        """Parameters of the model (tied embeddings counted once)."""
        q = self.dim * self.n_heads * self.head_dim
        kv = 2 * self.dim * self.n_kv_heads * self.head_dim
        o = self.n_heads * self.head_dim * self.dim
        bias = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim if self.attention_bias else 0
        qk = {"": 0, "head": 2 * self.head_dim, "proj": (self.n_heads + self.n_kv_heads) * self.head_dim}
        block_norms = {"pre": 2, "sandwich": 4, "post": 2}[self.norm_placement]
        norms = block_norms * self.dim + qk[self.qk_norm]
        mlp = 3 * self.dim * self.hidden_dim
        layer = q + kv + o + bias + norms + mlp
        embed = self.vocab_size * self.dim
        head = 0 if self.tie_word_embeddings else embed
        return self.n_layers * layer + embed + head + self.dim
