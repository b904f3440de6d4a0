"""The one eager model definition: a decoder-only transformer with a static KV cache.

One definition for every family ``families/`` reads (Llama 2/3.x, SmolLM2/3, Qwen2/2.5/3, Gemma 3,
Mistral, Granite, OLMo 2): the features they differ by are named fields of ``ModelArgs`` (per-layer
sliding window and RoPE base, norm placement, q/k norm scope, activation, multipliers, soft-cap).
Sliding-window layers keep a ring of the window, not a cache of ``max_seq_len``. The calling convention
is the one ExecuTorch's LLM runner uses: ``forward(tokens: int64[1, T], input_pos: int64[1]) ->
logits``, where ``input_pos`` holds the position of ``tokens[:, 0]`` and the cache lives inside the
module as buffers.

Shapes in comments: B batch (1), T new tokens, S max sequence length, H query heads, K kv heads, D head
dim, E model dim, V vocabulary.
"""

from __future__ import annotations

import math
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

# Plain architecture values live torch-free (recipes and the build plan need them); re-exported here.
from .args import LinearRopeScaling, LongRopeScaling, ModelArgs, RopeScaling
from .cache import SDPA, KVCache, RingKVCache, RingSDPA

__all__ = [
    "SDPA",
    "Attention",
    "FeedForward",
    "GeluTanh",
    "KVCache",
    "LinearRopeScaling",
    "ModelArgs",
    "RMSNorm",
    "RingKVCache",
    "RingSDPA",
    "Rope",
    "RopeScaling",
    "RotateHalf",
    "Transformer",
    "TransformerBlock",
    "precompute_rope",
]


class Rope(NamedTuple):
    """cos, sin [1, T, 1, D] of the global layers and of the sliding-window (local) layers."""

    cos: torch.Tensor
    sin: torch.Tensor
    local_cos: torch.Tensor
    local_sin: torch.Tensor


def precompute_rope(
    args: ModelArgs, max_seq_len: int, local: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [S, D] in the "rotate half" layout that Hugging Face checkpoints use.
    ``local``: the sliding-window layers' tables (their own base, never scaled), where they differ."""
    d = args.rope_dim
    theta = args.local_rope_theta if local and args.local_rope_theta is not None else args.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    gain = 1.0
    s = None if local else args.rope_scaling
    if isinstance(s, RopeScaling):
        inv_freq = _scale_llama3(inv_freq, s)
    elif isinstance(s, LinearRopeScaling):
        inv_freq = inv_freq / s.factor
    elif isinstance(s, LongRopeScaling):
        long = max_seq_len > s.original_max_position_embeddings
        inv_freq = inv_freq / torch.tensor(s.long_factor if long else s.short_factor, dtype=torch.float64)
        gain = s.attention_factor
    t = torch.arange(max_seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)  # [S, R/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [S, R]
    cos, sin = emb.cos() * gain, emb.sin() * gain
    if d < args.head_dim:  # partial rotary: the other dims pass through (cos 1, sin 0)
        rest = args.head_dim - d
        cos = torch.cat([cos, torch.ones(max_seq_len, rest, dtype=cos.dtype)], -1)
        sin = torch.cat([sin, torch.zeros(max_seq_len, rest, dtype=sin.dtype)], -1)
    return cos.float(), sin.float()


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
    """RoPE's partner term in the rotate-half layout: [x1, x2] -> [-x2, x1] over the first
    ``rotary_dim`` dims of the head (the rest pass unchanged, multiplied by a zero sine). A module,
    not a function, so a target can swap in another form of the same map (``transforms.py``)."""

    def __init__(self, rotary_dim: int = 0) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.rotary_dim or x.shape[-1]
        half = r // 2
        parts = [-x[..., half:r], x[..., :half]]
        return torch.cat(parts if r == x.shape[-1] else [*parts, x[..., r:]], dim=-1)


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


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, max_seq_len: int, cache_dtype: torch.dtype) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.window = args.window(layer)
        self.use_rope = layer not in args.nope_layers
        self.scale = args.attention_scale
        bias = args.attention_bias
        q_dim, kv_dim = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        self.wq = nn.Linear(args.dim, q_dim, bias=bias)
        self.wk = nn.Linear(args.dim, kv_dim, bias=bias)
        self.wv = nn.Linear(args.dim, kv_dim, bias=bias)
        self.wo = nn.Linear(q_dim, args.dim, bias=False)
        self.qk_norm = args.qk_norm
        norm_dims = {"": None, "head": (args.head_dim, args.head_dim), "proj": (q_dim, kv_dim)}[args.qk_norm]
        self.q_norm = RMSNorm(norm_dims[0], args.norm_eps) if norm_dims else None
        self.k_norm = RMSNorm(norm_dims[1], args.norm_eps) if norm_dims else None
        self.kv_cache: KVCache
        self.sdpa: nn.Module
        if self.window:
            self.kv_cache = RingKVCache(args.n_kv_heads, args.head_dim, self.window, max_seq_len, cache_dtype)
            self.sdpa = RingSDPA(self.window, args.attention_scale)
        else:
            self.kv_cache = KVCache(args.n_kv_heads, args.head_dim, max_seq_len, cache_dtype)
            self.sdpa = SDPA(args.attention_scale)
        self.rotary_dim = args.rope_dim
        self.rotate_half: nn.Module = RotateHalf(args.rope_dim)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D]; cos, sin [1, T, 1, D]."""
        return x * cos + self.rotate_half(x) * sin

    def forward(self, x: torch.Tensor, rope: Rope, start_pos: int) -> torch.Tensor:
        # -1 for the sequence: XNNPACK delegates a reshape with one inferred dim, not a symbolic one.
        bsz = x.shape[0]
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        if self.qk_norm == "proj" and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(bsz, -1, self.n_heads, self.head_dim)
        k = k.view(bsz, -1, self.n_kv_heads, self.head_dim)
        v = v.view(bsz, -1, self.n_kv_heads, self.head_dim)
        if self.qk_norm == "head" and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            cos, sin = (rope.local_cos, rope.local_sin) if self.window else (rope.cos, rope.sin)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        k_all, v_all = self.kv_cache.update(start_pos, k, v)
        return self.wo(self.sdpa(q, k_all, v_all, start_pos))


class GeluTanh(nn.Module):
    """GELU, tanh approximation (Gemma's ``gelu_pytorch_tanh``). A module so a target can swap in
    another form of the same function (``transforms.py``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, activation: str = "silu") -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)  # up
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)  # down
        self.act: nn.Module = nn.SiLU() if activation == "silu" else GeluTanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Norms where the family puts them: before each sub-layer ("pre", Llama), before and after
    ("sandwich", Gemma), or after only ("post", OLMo 2). An absent norm is an ``Identity``, so the
    block has no weight the checkpoint does not."""

    def __init__(self, args: ModelArgs, layer: int, max_seq_len: int, cache_dtype: torch.dtype) -> None:
        super().__init__()
        self.attention = Attention(args, layer, max_seq_len, cache_dtype)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim, args.activation)
        pre, post = args.norm_placement in ("pre", "sandwich"), args.norm_placement in ("sandwich", "post")

        def norm(present: bool) -> nn.Module:
            return RMSNorm(args.dim, args.norm_eps) if present else nn.Identity()

        self.attention_norm, self.ffn_norm = norm(pre), norm(pre)
        self.post_attention_norm, self.post_ffn_norm = norm(post), norm(post)
        self.residual_multiplier = args.residual_multiplier

    def forward(self, x: torch.Tensor, rope: Rope, start_pos: int) -> torch.Tensor:
        a = self.post_attention_norm(self.attention(self.attention_norm(x), rope, start_pos))
        h = x + (a if self.residual_multiplier == 1.0 else a * self.residual_multiplier)
        f = self.post_ffn_norm(self.feed_forward(self.ffn_norm(h)))
        return h + (f if self.residual_multiplier == 1.0 else f * self.residual_multiplier)


class Transformer(nn.Module):
    """Decoder with a static cache of ``max_seq_len`` positions; returns logits for every new token."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    rope_local_cos: torch.Tensor
    rope_local_sin: torch.Tensor

    def __init__(self, args: ModelArgs, max_seq_len: int, cache_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.args = args
        self.max_seq_len = max_seq_len
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(
            TransformerBlock(args, i, max_seq_len, cache_dtype) for i in range(args.n_layers)
        )
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Own tables for the sliding-window layers only where their RoPE differs (Gemma 3's: a base of
        # their own, never scaled); Mistral's and Phi-3's windowed layers share the global tables, read
        # twice rather than registered twice (export would have to de-duplicate aliased buffers).
        self.local_rope = bool(args.layer_windows) and args.local_rope_theta is not None
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
        if self.local_rope:
            cos, sin = precompute_rope(self.args, self.max_seq_len, local=True)
            self.register_buffer("rope_local_cos", cos, persistent=False)
            self.register_buffer("rope_local_sin", sin, persistent=False)
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
                module.resize(max_seq_len)
        self.init_buffers()

    def cast_rope(self, dtype: torch.dtype) -> None:
        """The RoPE tables in the compute dtype (they are made in fp32)."""
        names = ("rope_cos", "rope_sin") + (("rope_local_cos", "rope_local_sin") if self.local_rope else ())
        for name in names:
            self.register_buffer(name, getattr(self, name).to(dtype), persistent=False)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> scaled embeddings [B, T, E]."""
        return self.scale_embedding(self.tok_embeddings(tokens))

    def scale_embedding(self, rows: torch.Tensor) -> torch.Tensor:
        """Embedding rows as the first block takes them (Gemma multiplies by sqrt(E), in their dtype)."""
        scale = self.args.embedding_scale
        return rows if scale == 1.0 else rows * torch.tensor(scale, dtype=rows.dtype)

    def hidden(
        self, tokens: torch.Tensor, input_pos: torch.Tensor, embedded: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens [B, T], input_pos [1] -> final-norm hidden states [B, T, E]; fills the cache.
        ``embedded``: the tokens' embedding rows, already looked up (not yet scaled) by the caller."""
        seq_len = tokens.shape[1]
        # A data-dependent start position, as ExecuTorch's own Llama does: export keeps it symbolic,
        # and the checks tell it that every slice below stays inside the static buffers.
        start_pos = cast(int, input_pos[0].item())
        torch._check(start_pos >= 0)
        torch._check(start_pos + seq_len <= self.max_seq_len)
        h = self.scale_embedding(self.tok_embeddings(tokens) if embedded is None else embedded)
        rope = Rope(*(t.to(h.dtype) for t in self.rope_window(start_pos, seq_len)))
        for layer in self.layers:
            h = layer(h, rope, start_pos)
        return self.norm(h)

    def rope_window(self, start_pos: int, seq_len: int) -> Rope:
        """RoPE tables [1, T, 1, D] for positions start_pos ..: sliced and broadcast once for all
        layers, not once per layer."""
        tables = (self.rope_cos, self.rope_sin) * 2
        if self.local_rope:
            tables = (self.rope_cos, self.rope_sin, self.rope_local_cos, self.rope_local_sin)
        return Rope(*(t.narrow(0, start_pos, seq_len)[None, :, None, :] for t in tables))

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's output as the family defines logits: Granite divides, Gemma 2 soft-caps."""
        if self.args.logit_scale != 1.0:
            logits = logits * self.args.logit_scale
        if (cap := self.args.final_logit_softcap) is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.finish_logits(self.output(hidden))

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, T], input_pos [1] -> logits [B, T, V]."""
        return self.logits(self.hidden(tokens, input_pos))

    def reset_cache(self) -> None:
        for module in self.modules():
            if isinstance(module, Attention):
                for buf in module.kv_cache.buffers():
                    buf.zero_()
