"""Shared fixtures: tiny seeded checkpoints that Hugging Face transformers itself writes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

from exporter.build.pipeline import DEFAULT_CHECKPOINT

# Fuzz tests (tests/fuzz) run derandomized by default, so CI sees the same inputs on every run and a
# failure reproduces; HYPOTHESIS_PROFILE=explore draws fresh random inputs (and saves failures) locally.
_SLOW_OK = [HealthCheck.too_slow]  # some examples write and open a checkpoint folder
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, suppress_health_check=_SLOW_OK
)
settings.register_profile("explore", derandomize=False, deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "vocab_size": 4096,  # the shipped tokenizer's, so tiny models can be tokenized and played
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def write_hf_checkpoint(
    folder: Path,
    family: str = "llama",
    dtype: torch.dtype = torch.float32,
    max_shard_size: str | None = None,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """``save_pretrained`` of a randomly initialised (seeded) transformers model + shipped tokenizer."""
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "granite": (transformers.GraniteConfig, transformers.GraniteForCausalLM),
        "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM),
        "smollm3": (transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
    }
    config_cls, model_cls = classes[family]
    torch.manual_seed(seed)
    perturb = overrides.pop("perturb", False)
    model = model_cls(config_cls(**{**TINY, **overrides})).to(dtype).eval()
    if perturb:  # norms start at 1 (or 0 where stored as 1 + w): give them values that test the math
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.3)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    for name in ("tokenizer.json", "tokenizer_config.json", "heldout.txt"):
        shutil.copyfile(DEFAULT_CHECKPOINT / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    def make(name: str = "tiny", **kwargs: Any) -> Path:
        return write_hf_checkpoint(tmp_path_factory.mktemp("ckpt") / name, **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(make_checkpoint: Callable[..., Path]) -> Path:
    return make_checkpoint("tiny-llama")


@pytest.fixture
def tiny_copy(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    """A private copy a test may damage."""
    return Path(shutil.copytree(tiny_checkpoint, tmp_path / "tiny-llama"))


@pytest.fixture(scope="session")
def tiny_artifact(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (small) published artifact: reference-fp32 of the tiny checkpoint."""
    from exporter.build.pipeline import build

    overrides = ("export.max_seq_len=128", "validation.eval_tokens=64")
    return build(
        "reference-fp32", checkpoint=tiny_checkpoint, out=tmp_path_factory.mktemp("art"), overrides=overrides
    )
