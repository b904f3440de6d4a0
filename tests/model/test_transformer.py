"""The eager model on its own: cache semantics and the shapes of its calling convention."""

from __future__ import annotations

import pytest
import torch

from exporter.model.transformer import ModelArgs, Transformer

ARGS = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=64, vocab_size=50)


def seeded_model(max_seq_len: int = 32) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ARGS, max_seq_len).eval()


def test_forward_shapes() -> None:
    logits = seeded_model()(torch.zeros(1, 5, dtype=torch.long), torch.tensor([0]))
    assert logits.shape == (1, 5, ARGS.vocab_size)


def test_token_by_token_equals_full_prefill() -> None:
    model = seeded_model()
    tokens = torch.randint(0, ARGS.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens, torch.tensor([0]))
        model.reset_cache()
        steps = [model(tokens[:, i : i + 1], torch.tensor([i])) for i in range(12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_stale_cache_beyond_position_is_ignored() -> None:
    model = seeded_model()
    a = torch.randint(0, ARGS.vocab_size, (1, 10), generator=torch.Generator().manual_seed(1))
    b = torch.randint(0, ARGS.vocab_size, (1, 4), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(a, torch.tensor([0]))  # fills positions 0..9
        reused = model(b, torch.tensor([0]))  # a new sequence over the old cache
        model.reset_cache()
        fresh = model(b, torch.tensor([0]))
    torch.testing.assert_close(reused, fresh)


def test_tied_embeddings_share_one_tensor() -> None:
    args = ModelArgs(**{**vars(ARGS), "tie_word_embeddings": True})
    model = Transformer(args, 16)
    assert model.output.weight is model.tok_embeddings.weight
    assert args.parameter_count() == sum(p.numel() for p in model.parameters())


def test_bad_head_grouping_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        ModelArgs(dim=32, n_layers=1, n_heads=3, n_kv_heads=2, head_dim=8, hidden_dim=64, vocab_size=10)
