"""The one eager model definition: a Llama-family decoder with a static KV cache.

Covers Llama 2/3.x (incl. ``llama3`` RoPE scaling), Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k
RMSNorm, explicit ``head_dim``), SmolLM2 and TinyLlama. The calling convention is the one ExecuTorch's
LLM runner uses: ``forward(tokens: int64[1, T], input_pos: int64[1]) -> logits``, where ``input_pos``
holds the position of ``tokens[:, 0]`` and the cache lives inside the module as buffers.

Shapes in comments: B batch (1), T new tokens, S max sequence length, H query heads, K kv heads,
D head dim, E model dim, V vocabulary.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

# Plain architecture values live torch-free (recipes and the build plan need them); re-exported here.
from .args import ModelArgs, RopeScaling


def precompute_rope(args: ModelArgs, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [S, D] in the "rotate half" layout that Hugging Face checkpoints use."""
    d = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if args.rope_scaling is not None:
        inv_freq = _scale_llama3(inv_freq, args.rope_scaling)
    t = torch.arange(max_seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)  # [S, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [S, D]
    return emb.cos().float(), emb.sin().float()


def _scale_llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Same piecewise rule as Meta's reference and transformers' `_compute_llama3_parameters`.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotateHalf(nn.Module):
    """RoPE's partner term in the rotate-half layout: [x1, x2] -> [-x2, x1] along the head dim. A module,
    not a function, so a target can swap in another form of the same map (``transforms.py``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the reference implementations, whatever the activation dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class KVCache(nn.Module):
    """Static cache, [B, K, S, D] per tensor, updated in place at ``start_pos``."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor

    def __init__(self, n_kv_heads: int, head_dim: int, max_seq_len: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.n_kv_heads, self.head_dim, self.max_seq_len, self.dtype = (
            n_kv_heads,
            head_dim,
            max_seq_len,
            dtype,
        )
        self.init_buffers()

    def cache_shape(self) -> tuple[int, int, int, int]:
        return (1, self.n_kv_heads, self.max_seq_len, self.head_dim)

    def init_buffers(self) -> None:
        shape = self.cache_shape()
        self.register_buffer("k_cache", torch.zeros(shape, dtype=self.dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=self.dtype), persistent=False)

    def update(self, start_pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, T, K, D] -> whole caches [B, K, S, D]."""
        seq_len = k.shape[1]
        self.k_cache.narrow(2, start_pos, seq_len).copy_(k.transpose(1, 2))
        self.v_cache.narrow(2, start_pos, seq_len).copy_(v.transpose(1, 2))
        return self.k_cache, self.v_cache


class SDPA(nn.Module):
    """Causal attention of T new queries over the whole cache. The mask is computed from positions,
    not stored: a [S, S] buffer per layer would be the largest constant of a small model."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> torch.Tensor:
        """q [B, T, H, D]; k, v [B, K, S, D] -> [B, T, H*D]."""
        bsz, seq_len, _, _ = q.shape
        q_pos = torch.arange(seq_len, device=q.device) + start_pos
        k_pos = torch.arange(k.shape[2], device=q.device)
        mask = k_pos[None, :] <= q_pos[:, None]  # [T, S], True = may attend
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=True)
        return y.transpose(1, 2).reshape(bsz, seq_len, q.shape[2] * q.shape[3])


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, max_seq_len: int, cache_dtype: torch.dtype) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        bias = args.attention_bias
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=bias)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.kv_cache: KVCache = KVCache(args.n_kv_heads, args.head_dim, max_seq_len, cache_dtype)
        self.sdpa: nn.Module = SDPA()
        self.rotate_half: nn.Module = RotateHalf()

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D]; cos, sin [1, T, 1, D]."""
        return x * cos + self.rotate_half(x) * sin

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start_pos: int) -> torch.Tensor:
        # -1 for the sequence: XNNPACK delegates a reshape with one inferred dim, not a symbolic one.
        bsz = x.shape[0]
        q = self.wq(x).view(bsz, -1, self.n_heads, self.head_dim)
        k = self.wk(x).view(bsz, -1, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(bsz, -1, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        k_all, v_all = self.kv_cache.update(start_pos, k, v)
        return self.wo(self.sdpa(q, k_all, v_all, start_pos))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)  # up
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, max_seq_len: int, cache_dtype: torch.dtype) -> None:
        super().__init__()
        self.attention = Attention(args, max_seq_len, cache_dtype)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start_pos: int) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, start_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder with a static cache of ``max_seq_len`` positions; returns logits for every new token."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, args: ModelArgs, max_seq_len: int, cache_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.args = args
        self.max_seq_len = max_seq_len
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(
            TransformerBlock(args, max_seq_len, cache_dtype) for _ in range(args.n_layers)
        )
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)create the non-persistent buffers: RoPE tables here, caches and masks in sub-modules.

        A model built on the meta device gets its weights assigned from the checkpoint and then calls
        this, so no full-size random initialisation ever happens."""
        cos, sin = precompute_rope(self.args, self.max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for module in self.modules():
            init = getattr(module, "init_buffers", None)
            if module is not self and callable(init):
                init()

    def resize_cache(self, max_seq_len: int) -> None:
        """Give the KV caches and RoPE tables ``max_seq_len`` positions (fresh, empty). Tuning
        trains on windows that may be longer than the exported cache."""
        self.max_seq_len = max_seq_len
        for module in self.modules():
            if isinstance(module, KVCache):
                module.max_seq_len = max_seq_len
        self.init_buffers()

    def hidden(
        self, tokens: torch.Tensor, input_pos: torch.Tensor, embedded: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens [B, T], input_pos [1] -> final-norm hidden states [B, T, E]; fills the cache.
        ``embedded``: the tokens' embedding rows, already looked up by the caller."""
        seq_len = tokens.shape[1]
        # A data-dependent start position, as ExecuTorch's own Llama does: export keeps it symbolic,
        # and the checks tell it that every slice below stays inside the static buffers.
        start_pos = cast(int, input_pos[0].item())
        torch._check(start_pos >= 0)
        torch._check(start_pos + seq_len <= self.max_seq_len)
        h = self.tok_embeddings(tokens) if embedded is None else embedded
        cos, sin = (t.to(h.dtype) for t in self.rope_window(start_pos, seq_len))
        for layer in self.layers:
            h = layer(h, cos, sin, start_pos)
        return self.norm(h)

    def rope_window(self, start_pos: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, T, 1, D] for positions start_pos ..: sliced and broadcast once for all
        layers, not once per layer."""
        return (
            self.rope_cos.narrow(0, start_pos, seq_len)[None, :, None, :],
            self.rope_sin.narrow(0, start_pos, seq_len)[None, :, None, :],
        )

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, T], input_pos [1] -> logits [B, T, V]."""
        return self.output(self.hidden(tokens, input_pos))

    def reset_cache(self) -> None:
        for module in self.modules():
            if isinstance(module, Attention):
                for buf in module.kv_cache.buffers():
                    buf.zero_()
