"""Each source transform is compared with the module it replaces."""

from __future__ import annotations

import torch

from exporter.model.transformer import FeedForward, GeluTanh, RMSNorm, RotateHalf, Transformer
from exporter.model.transforms import (
    DelegableRMSNorm,
    LastTokenLogits,
    RotateHalfMatmul,
    SigmoidGeluTanh,
    replace_gelu_tanh_with_sigmoid_form,
    replace_rms_norm_with_delegable,
    replace_rotate_half_with_matmul,
    replace_sdpa_with_custom_sdpa,
)
from tests.model.test_transformer import ARGS, seeded_model


def _prefill_then_decode(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = [model(tokens[:, :7], torch.tensor([0]))]
        out += [model(tokens[:, i : i + 1], torch.tensor([i])) for i in range(7, tokens.shape[1])]
    return torch.cat([o.reshape(1, -1, ARGS.vocab_size) for o in out], 1)


def test_custom_sdpa_matches_default_attention() -> None:
    tokens = torch.randint(0, ARGS.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    expected = _prefill_then_decode(seeded_model(), tokens)
    custom: Transformer = replace_sdpa_with_custom_sdpa(seeded_model())
    assert all(type(m.attention.kv_cache).__name__ == "CustomKVCache" for m in custom.layers)
    torch.testing.assert_close(_prefill_then_decode(custom, tokens), expected, atol=1e-5, rtol=1e-5)


def test_last_token_logits_is_the_last_row() -> None:
    model = seeded_model()
    tokens = torch.randint(0, ARGS.vocab_size, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens, torch.tensor([0]))
        model.reset_cache()
        last = LastTokenLogits(model)(tokens, torch.tensor([0]))
    torch.testing.assert_close(last, full[:, -1, :])


def test_delegable_rms_norm_matches_rms_norm() -> None:
    tokens = torch.randint(0, ARGS.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    expected = _prefill_then_decode(seeded_model(), tokens)
    model = replace_rms_norm_with_delegable(seeded_model())
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert norms and all(type(m) is DelegableRMSNorm for m in norms)
    torch.testing.assert_close(_prefill_then_decode(model, tokens), expected, atol=1e-5, rtol=1e-5)


def test_rotate_half_matmul_is_exactly_rotate_half() -> None:
    x = torch.randn(1, 5, 3, 16, generator=torch.Generator().manual_seed(6))
    assert torch.equal(RotateHalfMatmul(16, torch.float32)(x), RotateHalf()(x))


def test_rotate_half_matmul_model_matches() -> None:
    tokens = torch.randint(0, ARGS.vocab_size, (1, 12), generator=torch.Generator().manual_seed(7))
    expected = _prefill_then_decode(seeded_model(), tokens)
    model = replace_rotate_half_with_matmul(seeded_model())
    assert all(type(m.attention.rotate_half) is RotateHalfMatmul for m in model.layers)
    torch.testing.assert_close(_prefill_then_decode(model, tokens), expected, atol=1e-6, rtol=1e-6)


def test_sigmoid_form_is_gelu_tanh() -> None:
    """x * sigmoid(2z) is 0.5 * x * (1 + tanh(z)): the same function, not a nearby one."""
    x = torch.linspace(-12, 12, 20001, dtype=torch.float64)
    expected = torch.nn.functional.gelu(x, approximate="tanh")
    assert (SigmoidGeluTanh()(x) - expected).abs().max().item() < 1e-12


def test_gelu_tanh_swapped_and_silu_left() -> None:
    gelu, silu = FeedForward(8, 16, "gelu_tanh"), FeedForward(8, 16, "silu")
    assert type(gelu.act) is GeluTanh
    replace_gelu_tanh_with_sigmoid_form(gelu)
    replace_gelu_tanh_with_sigmoid_form(silu)
    assert type(gelu.act) is SigmoidGeluTanh and type(silu.act) is torch.nn.SiLU
