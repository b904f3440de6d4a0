"""Every family against transformers, on tiny checkpoints transformers wrote with each family's twists
(windows shorter than the prompt, multipliers, norms away from their initial values)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.model.checkpoint import open_checkpoint

from .parity import PARITY_TOL, max_error

W = 8  # sliding window of the tests: shorter than the 12-token prefill and the 40 positions
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"family": "llama"},
    "qwen2-sliding": {
        "family": "qwen2",
        "use_sliding_window": True,
        "sliding_window": W,
        "max_window_layers": 1,
    },
    "qwen3": {"family": "qwen3", "head_dim": 32},
    "gemma3": {
        "family": "gemma3",
        "num_hidden_layers": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "sliding_window": W,
        "query_pre_attn_scalar": 24,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        "final_logit_softcapping": 5.0,
    },
    "mistral": {"family": "mistral", "sliding_window": W},
    # a window longer than the cache (64): a ring of max_seq_len slots that never wraps
    "mistral-long-window": {"family": "mistral", "sliding_window": 100},
    "granite": {
        "family": "granite",
        "embedding_multiplier": 12.0,
        "attention_multiplier": 0.1,
        "residual_multiplier": 0.22,
        "logits_scaling": 8.0,
    },
    "olmo2": {"family": "olmo2"},
    # Phi-4-mini's shape of twist: 3/4 partial rotary, LongRoPE, tied embeddings; windowed like Phi-3
    "phi3": {
        "family": "phi3",
        "partial_rotary_factor": 0.75,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 10_000.0,
            "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.1 * i for i in range(6)],
            "long_factor": [2.0 + 0.5 * i for i in range(6)],
        },
        "original_max_position_embeddings": 256,
        "max_position_embeddings": 1024,
        "sliding_window": W,
        "tie_word_embeddings": True,
        "pad_token_id": 2,
    },
    "smollm3": {"family": "smollm3", "num_hidden_layers": 4, "no_rope_layer_interval": 2, "pad_token_id": 2},
}


@pytest.fixture(scope="module")
def family_checkpoint(make_checkpoint: Callable[..., Path]) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = make_checkpoint(f"family-{name}", perturb=True, **FAMILIES[name])
        return made[name]

    return get


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_eager_fp32_matches_transformers(family_checkpoint: Callable[[str], Path], name: str) -> None:
    assert max_error(family_checkpoint(name)) <= PARITY_TOL


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_custom_sdpa_matches_transformers(family_checkpoint: Callable[[str], Path], name: str) -> None:
    """The form the device recipes export: ExecuTorch's custom SDPA, rings in its cache layout."""
    assert max_error(family_checkpoint(name), custom_sdpa=True) <= PARITY_TOL


def test_features_the_twists_turn_on(family_checkpoint: Callable[[str], Path]) -> None:
    """The checkpoints above do exercise what they are meant to (a parity test of a feature that is
    off would prove nothing)."""
    args = {name: open_checkpoint(family_checkpoint(name)).args for name in FAMILIES}
    assert args["gemma3"].layer_windows == (W, 0, W, 0)
    assert args["gemma3"].norm_placement == "sandwich" and args["gemma3"].final_logit_softcap == 5.0
    assert args["qwen2-sliding"].layer_windows == (0, W)
    assert args["mistral"].layer_windows == (W, W)
    assert args["mistral-long-window"].layer_windows == (100, 100)
    assert args["granite"].residual_multiplier == 0.22 and args["granite"].logit_scale == 1 / 8
    assert args["olmo2"].norm_placement == "post" and args["olmo2"].qk_norm == "proj"
    assert args["smollm3"].nope_layers == (1, 3)
    assert args["phi3"].rotary_dim == 12 and args["phi3"].layer_windows == (W, W)
    assert args["phi3"].rope_scaling is not None
