"""Source transforms: ``replace_x_with_y(model) -> model``. Target differences live here, never in
``ModelArgs``; each transform is tested for equivalence with the module it replaces."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..recipe import Recipe
from .cache import ring_mask
from .transformer import Attention, GeluTanh, KVCache, RingKVCache, RMSNorm, RotateHalf, Transformer


def load_custom_ops() -> None:
    """Register ExecuTorch's ``llama::custom_sdpa`` / ``llama::update_cache`` with PyTorch."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401


class CustomKVCache(KVCache):
    """Cache in the [B, S, K, D] layout that ``llama::update_cache`` and ``llama::custom_sdpa`` use."""

    seq_dim = 1

    def update(self, start_pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, T, K, D] -> whole caches [B, S, K, D]."""
        torch.ops.llama.update_cache(k, self.k_cache, start_pos)
        torch.ops.llama.update_cache(v, self.v_cache, start_pos)
        return self.k_cache, self.v_cache


class CustomSDPA(nn.Module):
    """``llama::custom_sdpa``: causal from ``start_pos``, grouped-query heads handled by the kernel,
    so there is no mask buffer and no repeated K/V."""

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> torch.Tensor:
        """q [B, T, H, D]; k, v [B, S, K, D] -> [B, T, H*D]."""
        bsz = q.shape[0]
        y = torch.ops.llama.custom_sdpa(q, k, v, start_pos, None, 0.0, True, self.scale)
        return y.reshape(bsz, -1, q.shape[2] * q.shape[3])  # one inferred dim: delegable


class CustomRingKVCache(RingKVCache):
    """``RingKVCache`` in the [B, R, K, D] layout ``llama::custom_sdpa`` reads."""

    seq_dim = 1


class CustomRingSDPA(nn.Module):
    """``llama::custom_sdpa`` over a ring and the new keys, with the window's mask (additive); the
    kernel ignores ``start_pos`` when it is given a mask."""

    def __init__(self, window: int, scale: float | None = None) -> None:
        super().__init__()
        self.window, self.scale = window, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> torch.Tensor:
        """q [B, T, H, D]; k, v [B, R + T, K, D] -> [B, T, H*D]."""
        bsz, seq_len = q.shape[0], q.shape[1]
        allowed = ring_mask(self.window, k.shape[1] - seq_len, start_pos, seq_len)
        mask = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
        y = torch.ops.llama.custom_sdpa(q, k, v, 0, mask, 0.0, False, self.scale)
        return y.reshape(bsz, -1, q.shape[2] * q.shape[3])


def replace_sdpa_with_custom_sdpa(model: Transformer) -> Transformer:
    load_custom_ops()
    for module in model.modules():
        if not isinstance(module, Attention):
            continue
        old, scale = module.kv_cache, module.scale
        if type(old) is RingKVCache:
            module.kv_cache = CustomRingKVCache(
                old.n_kv_heads, old.head_dim, old.window, old.max_seq_len, old.dtype
            )
            module.sdpa = CustomRingSDPA(old.window, scale)
        else:
            assert type(old) is KVCache, "custom SDPA replaces the default caches only"
            module.kv_cache = CustomKVCache(old.n_kv_heads, old.head_dim, old.max_seq_len, old.dtype)
            module.sdpa = CustomSDPA(scale)
    return model


class DelegableRMSNorm(RMSNorm):
    """RMSNorm whose mean is taken over a [N, 1, E, 1] view, the one form of ``mean.dim`` XNNPACK
    lowers (a global average pool). With the plain [B, T, E] mean every norm falls out of the
    delegate and splits the graph: 19 partitions and a CPU round trip per norm on a 4-layer model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        squares = xf.pow(2).reshape(-1, 1, xf.shape[-1], 1)
        # [B, -1, 1] or [B, -1, H, 1]: one inferred dim, so the reshape is delegable too.
        mean = squares.mean((2, 3), keepdim=True).reshape(xf.shape[0], -1, *xf.shape[2:-1], 1)
        return self.weight * (xf * torch.rsqrt(mean + self.eps)).to(x.dtype)


def replace_rms_norm_with_delegable(model: nn.Module) -> nn.Module:
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is RMSNorm:
                norm = DelegableRMSNorm(child.weight.shape[0], child.eps)
                norm.weight = child.weight
                setattr(parent, name, norm)
    return model


class RotateHalfMatmul(nn.Module):
    """Rotate-half as ``x @ R`` with R a constant signed permutation. The slices of the plain form act
    on a tensor whose sequence length is dynamic, which XNNPACK does not delegate: each layer's RoPE
    fell out of the delegate and split its graph in two. Every output is one input times +-1, so the
    product is exact in fp32 (and in bf16)."""

    rotation: torch.Tensor

    def __init__(self, head_dim: int, dtype: torch.dtype, rotary_dim: int = 0) -> None:
        super().__init__()
        half = (rotary_dim or head_dim) // 2
        # dims past rotary_dim map to 0: RoPE multiplies them by a zero sine
        w = torch.zeros(head_dim, head_dim, dtype=dtype)  # F.linear weight [out, in] = R^T
        w[torch.arange(half), torch.arange(half) + half] = -1.0
        w[torch.arange(half) + half, torch.arange(half)] = 1.0
        self.register_buffer("rotation", w, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.rotation)


def replace_rotate_half_with_matmul(model: Transformer) -> Transformer:
    """Called after the model is cast: the RoPE tables carry its compute dtype (``KVCache.dtype``
    records only the dtype the cache was built with)."""
    for module in model.modules():
        if isinstance(module, Attention) and type(module.rotate_half) is RotateHalf:
            module.rotate_half = RotateHalfMatmul(module.head_dim, model.rope_cos.dtype, module.rotary_dim)
    return model


class SigmoidGeluTanh(nn.Module):
    """GELU's tanh approximation as x * sigmoid(2z), the same function (0.5 * (1 + tanh(z)) is
    sigmoid(2z)). ExecuTorch 1.5.1's XNNPACK lowering maps ``gelu(approximate="tanh")`` to XNNPACK's
    erf GELU, up to 4.7e-4 away per activation; this form lowers to ops it delegates as written."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(_TWO_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))


_TWO_SQRT_2_OVER_PI = 2 * math.sqrt(2 / math.pi)


def replace_gelu_tanh_with_sigmoid_form(model: nn.Module) -> nn.Module:
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is GeluTanh:
                setattr(parent, name, SigmoidGeluTanh())
    return model


class LastTokenLogits(nn.Module):
    """What is exported: logits of the last new token only, [B, V], as ExecuTorch's LLM runner
    expects by default; the output projection then runs on one row, not on the whole prompt."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        h = self.model.hidden(tokens, input_pos)
        return self.model.logits(h[:, -1, :]).float()  # fp32 logits whatever the compute dtype


def for_export(recipe: Recipe, model: Transformer) -> LastTokenLogits:
    """The transforms a recipe's target needs, then the exported wrapper."""
    if recipe.export.custom_sdpa:
        replace_sdpa_with_custom_sdpa(model)
    if recipe.backend == "xnnpack":
        replace_rms_norm_with_delegable(model)
        replace_gelu_tanh_with_sigmoid_form(model)
        replace_rotate_half_with_matmul(model)
    return LastTokenLogits(model).eval()
