"""The whole-model tuning path: what it refuses before any weight is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporter.errors import RecipeError
from exporter.model.transformer import ModelArgs
from exporter.quant.tune import (
    GPTQ_BYTES_PER_MODEL_PARAMETER,
    check_tuning_memory,
    gptq_memory_bytes,
    tuning_window,
)
from exporter.recipe import load_recipe

GiB = 2**30
# published shapes (SmolLM2-135M; Llama-3.2-1B), tied embeddings as they ship
SMOLLM2 = ModelArgs(576, 30, 9, 3, 64, 1536, 49152, tie_word_embeddings=True)
LLAMA_1B = ModelArgs(2048, 16, 32, 8, 64, 8192, 128256, tie_word_embeddings=True)


def test_a_tuning_that_cannot_fit_is_refused_naming_the_switch() -> None:
    recipe = load_recipe("android-arm64-qat")
    with pytest.raises(
        RecipeError, match=r"quantization\.qat: .*1\.50B-parameter.*--set quantization\.qat=false"
    ):
        check_tuning_memory(recipe, LLAMA_1B, Path("android-arm64.toml"), 24 * GiB)
    check_tuning_memory(recipe, SMOLLM2, Path("android-arm64.toml"), 24 * GiB)  # 6.7 GiB: fits
    with pytest.raises(RecipeError, match=r"about 6\.7 GiB"):
        check_tuning_memory(recipe, SMOLLM2, Path("android-arm64.toml"), 4 * GiB)


def test_recipes_that_do_not_tune_are_not_held_to_it() -> None:
    untuned = load_recipe("android-arm64-qat", ("quantization.qat=false", "quantization.mixed=false"))
    check_tuning_memory(untuned, LLAMA_1B, Path("android-arm64.toml"), 1 * GiB)
    mixed_only = load_recipe("android-arm64-qat", ("quantization.qat=false",))
    with pytest.raises(RecipeError, match=r"quantization\.mixed: .*--set quantization\.mixed=false"):
        check_tuning_memory(mixed_only, LLAMA_1B, Path("android-arm64.toml"), 24 * GiB)
    check_tuning_memory(load_recipe("android-arm64-qat"), LLAMA_1B, Path("x.toml"), None)  # not Linux


def test_tuning_window_is_the_longest_of_the_stages() -> None:
    assert tuning_window(load_recipe("android-arm64-qat")) == 256
    assert tuning_window(load_recipe("android-arm64-qat", ("quantization.qat=false",))) == 128
    assert tuning_window(load_recipe("reference-fp32")) == 0


def test_the_streamed_tuning_grows_with_the_quantized_model_not_with_the_fp32_one() -> None:
    recipe = load_recipe("android-arm64")
    settings = recipe.quantization.gptq
    assert settings is not None
    deeper = dataclasses.replace(LLAMA_1B, n_layers=2 * LLAMA_1B.n_layers)
    added = deeper.parameter_count() - LLAMA_1B.parameter_count()
    growth = gptq_memory_bytes(deeper, settings) - gptq_memory_bytes(LLAMA_1B, settings)
    assert growth == pytest.approx(GPTQ_BYTES_PER_MODEL_PARAMETER * added, rel=0.01)  # ~1 byte/param
    assert gptq_memory_bytes(LLAMA_1B, settings) < 10 * GiB  # the whole-model QAT: 62 GiB
    check_tuning_memory(recipe, LLAMA_1B, Path("android-arm64.toml"), 24 * GiB)
    with pytest.raises(RecipeError, match=r"quantization\.gptq: .*--set quantization\.gptq=false"):
        check_tuning_memory(recipe, LLAMA_1B, Path("android-arm64.toml"), 1 * GiB)


@pytest.mark.parametrize(
    ("override", "words"),
    [
        (
            "quantization.gptq.escalate.tokens=1000000",
            r"quantization\.gptq\.escalate\.texts\[0\]: select-prose has \d+ tokens, "
            r"escalate\.tokens needs 1000001",
        ),
        (
            "validation.judge_tokens=1000000",
            r"validation\.judge_texts\[0\]: .*other-prose\.txt has \d+ tokens, "
            r"validation\.judge_tokens needs 1000001",
        ),
    ],
)
def test_a_text_too_short_for_its_tokens_is_refused_before_any_weight(
    tiny_checkpoint: Path, override: str, words: str
) -> None:
    from exporter.build.pipeline import prepare

    with pytest.raises(RecipeError, match=words):
        prepare("android-arm64", tiny_checkpoint, None, (override,))
