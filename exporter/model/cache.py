"""KV caches and the attention over them.

``KVCache`` holds every position up to ``max_seq_len``; ``RingKVCache`` holds the last ``window``
positions of a sliding-window layer (Gemma 3's local layers, Mistral), so a 4,096-position build keeps
512 positions on those layers, not 4,096. Attention over a ring reads the ring as it was before this
call *and* the new keys, with a mask computed from positions, and only then overwrites the ring: a
prefill longer than the window stays exact (ExecuTorch's ``RingKVCache`` keeps twice the window and
caps a prefill at it instead). Like every ring buffer, it assumes positions arrive in order: a runner
that rewinds ``input_pos`` must re-prefill from a position at least a window back.

Shapes: B batch (1), T new tokens, S cache positions, W window, K kv heads, H query heads, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class KVCache(nn.Module):
    """Static cache, [B, K, S, D] per tensor, updated in place at ``start_pos``."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    # The sequence dimension of the cache tensors: 2 here ([B, K, S, D]), 1 in the layout
    # ExecuTorch's custom ops read ([B, S, K, D]); the shape and the ring update follow from it.
    seq_dim = 2

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
        if self.seq_dim == 1:
            return (1, self.max_seq_len, self.n_kv_heads, self.head_dim)
        return (1, self.n_kv_heads, self.max_seq_len, self.head_dim)

    def in_layout(self, x: torch.Tensor) -> torch.Tensor:
        """New keys or values [B, T, K, D] in the cache's layout."""
        return x if self.seq_dim == 1 else x.transpose(1, 2)

    def init_buffers(self) -> None:
        shape = self.cache_shape()
        self.register_buffer("k_cache", torch.zeros(shape, dtype=self.dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=self.dtype), persistent=False)

    def resize(self, max_seq_len: int) -> None:
        """Positions to hold after the next ``init_buffers``."""
        self.max_seq_len = max_seq_len

    def update(self, start_pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, T, K, D] -> whole caches [B, K, S, D]."""
        seq_len = k.shape[1]
        self.k_cache.narrow(self.seq_dim, start_pos, seq_len).copy_(self.in_layout(k))
        self.v_cache.narrow(self.seq_dim, start_pos, seq_len).copy_(self.in_layout(v))
        return self.k_cache, self.v_cache


class SDPA(nn.Module):
    """Causal attention of T new queries over the whole cache. The mask is computed from positions,
    not stored: a [S, S] buffer per layer would be the largest constant of a small model."""

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> torch.Tensor:
        """q [B, T, H, D]; k, v [B, K, S, D] -> [B, T, H*D]."""
        bsz, seq_len, _, _ = q.shape
        q_pos = torch.arange(seq_len, device=q.device) + start_pos
        k_pos = torch.arange(k.shape[2], device=q.device)
        mask = k_pos[None, :] <= q_pos[:, None]  # [T, S], True = may attend
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=True, scale=self.scale
        )
        return y.transpose(1, 2).reshape(bsz, seq_len, q.shape[2] * q.shape[3])


def ring_positions(slots: int, start_pos: int) -> torch.Tensor:
    """Position held by each of a ring's R slots before positions ``start_pos``.. are written [R];
    negative where the slot was never written. Slot s holds the latest position p < start_pos with
    p = s mod R."""
    last = start_pos - 1
    # + slots keeps the dividend >= 0 (last >= -1, s < slots): ExecuTorch's integer remainder takes
    # the dividend's sign, torch's the divisor's; they agree only on non-negative operands.
    return last - torch.remainder(last - torch.arange(slots) + slots, slots)


def ring_mask(window: int, slots: int, start_pos: int, seq_len: int) -> torch.Tensor:
    """[T, R + T], True = may attend: keys are the ring as it was, then the T new positions."""
    new = torch.arange(seq_len) + start_pos
    keys = torch.cat([ring_positions(slots, start_pos), new])
    delta = new[:, None] - keys[None, :]
    return (keys[None, :] >= 0) & (delta >= 0) & (delta < window)


def ring_write(cache: torch.Tensor, new: torch.Tensor, start_pos: int, seq_dim: int) -> None:
    """Write the new keys or values (sequence along ``seq_dim`` of both) into the ring in place.
    Every slot is rewritten from a gather, so a prefill longer than the window writes each slot once
    (with its latest position) and the shapes stay static: no duplicate-index scatter."""
    slots, seq_len = cache.shape[seq_dim], new.shape[seq_dim]
    after = ring_positions(slots, start_pos + seq_len)  # what each slot holds once written
    fresh = after >= start_pos
    gathered = new.index_select(seq_dim, (after - start_pos).clamp(min=0))
    shape = [1] * cache.dim()
    shape[seq_dim] = slots
    cache.copy_(torch.where(fresh.view(shape), gathered, cache))


class RingKVCache(KVCache):
    """The last ``window`` positions, [B, K, R, D] per tensor with R = min(W, max_seq_len) slots
    (a ring that never wraps when the sequence fits the window); ``update`` returns the ring as it
    was followed by the new keys and values, [B, K, R + T, D], and then overwrites the ring."""

    def __init__(
        self, n_kv_heads: int, head_dim: int, window: int, max_seq_len: int, dtype: torch.dtype
    ) -> None:
        self.window = window
        super().__init__(n_kv_heads, head_dim, min(window, max_seq_len), dtype)

    def resize(self, max_seq_len: int) -> None:
        self.max_seq_len = min(self.window, max_seq_len)

    def update(self, start_pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, T, K, D] -> the ring as it was, then the new ones, in the cache's layout."""
        k, v, dim = self.in_layout(k), self.in_layout(v), self.seq_dim
        keys, values = torch.cat([self.k_cache, k], dim=dim), torch.cat([self.v_cache, v], dim=dim)
        ring_write(self.k_cache, k, start_pos, dim)
        ring_write(self.v_cache, v, start_pos, dim)
        return keys, values


class RingSDPA(nn.Module):
    """Attention of T new queries over a ring's keys followed by their own (``RingKVCache``)."""

    def __init__(self, window: int, scale: float | None = None) -> None:
        super().__init__()
        self.window, self.scale = window, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> torch.Tensor:
        """q [B, T, H, D]; k, v [B, K, W + T, D] -> [B, T, H*D]."""
        bsz, seq_len, _, _ = q.shape
        mask = ring_mask(self.window, k.shape[2] - seq_len, start_pos, seq_len)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=True, scale=self.scale
        )
        return y.transpose(1, 2).reshape(bsz, seq_len, q.shape[2] * q.shape[3])
