"""The model's architecture as plain values: no torch, so recipes and the build plan can check and
key a build without importing it. ``exporter.model.transformer`` re-exports both names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (``rope_scaling.rope_type == "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


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
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    def parameter_count(self) -> int:
        """Parameters of the model (tied embeddings counted once)."""
        q = self.dim * self.n_heads * self.head_dim
        kv = 2 * self.dim * self.n_kv_heads * self.head_dim
        o = self.n_heads * self.head_dim * self.dim
        bias = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim if self.attention_bias else 0
        norms = 2 * self.dim + (2 * self.head_dim if self.qk_norm else 0)
        mlp = 3 * self.dim * self.hidden_dim
        layer = q + kv + o + bias + norms + mlp
        embed = self.vocab_size * self.dim
        head = 0 if self.tie_word_embeddings else embed
        return self.n_layers * layer + embed + head + self.dim
