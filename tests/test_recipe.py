"""Every shipped recipe loads; malformed recipes fail with the file and the key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.build.fits import check_fits
from exporter.errors import RecipeError
from exporter.model.checkpoint import open_checkpoint
from exporter.recipe import list_recipes, load_recipe

SHIPPED = ["android-arm64", "ios-arm64", "linux-arm64", "reference-fp32"]


def test_shipped_recipes_present() -> None:
    assert set(SHIPPED) <= {p.stem for p in list_recipes()}


@pytest.mark.parametrize("path", list_recipes(), ids=lambda p: p.stem)
def test_every_recipe_loads_and_fits_default_model(path: Path) -> None:
    recipe = load_recipe(str(path))
    assert recipe.name == path.stem
    from exporter.build.pipeline import DEFAULT_CHECKPOINT

    check_fits(recipe, open_checkpoint(DEFAULT_CHECKPOINT).args, path)


@pytest.mark.parametrize("name", ["android-arm64", "ios-arm64", "linux-arm64"])
def test_device_recipes_are_8da4w_group32_with_quantized_embedding(name: str) -> None:
    r = load_recipe(name)
    assert r.backend == "xnnpack" and r.export.custom_sdpa
    assert r.quantization.linear is not None and r.quantization.linear.scheme == "8da4w"
    assert r.quantization.linear.group_size == 32
    assert r.quantization.embedding is not None and r.quantization.embedding.group_size == 32
    # tuned on the model, streamed (GPTQ, int8 per block by measured error) on held-out-free text
    gptq = r.quantization.gptq
    assert gptq is not None and gptq.text == "calibration" and gptq.int8_size_ratio > 1
    assert r.quantization.mixed is None and r.quantization.qat is None


def test_a_streamed_tuning_excludes_the_whole_model_ones(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"quantization\.gptq: is a tuning of its own"):
        load_recipe("android-arm64-qat", ("quantization.gptq.windows=8",))
    for key, value in [
        ("windows", "0"),
        ("int8_size_ratio", "0.9"),
        ("measure_windows", "64"),
        ("head_bits", "6"),
    ]:
        with pytest.raises(RecipeError, match=rf"quantization\.gptq\.{key}"):
            load_recipe("android-arm64", (f"quantization.gptq.{key}={value}",))


def test_the_escalation_chooses_on_texts_no_gate_judges() -> None:
    for key, value in [
        ("aim", "1.2"),  # over the bar
        ("aim_size_ratio", "3.0"),  # over max_size_ratio
        ("texts", '["other-prose"]'),  # a judging text
        ("texts", "[]"),
        ("tokens", "0"),
    ]:
        with pytest.raises(RecipeError, match=rf"quantization\.gptq\.escalate\.{key}"):
            load_recipe("android-arm64", (f"quantization.gptq.escalate.{key}={value}",))
    with pytest.raises(RecipeError, match=r"'select-code' is also quantization\.gptq\.escalate's"):
        load_recipe("android-arm64", ('validation.judge_texts=["other-prose", "select-code"]',))
    with pytest.raises(RecipeError, match=r"'select-prose' is also quantization\.gptq\.escalate's"):
        load_recipe("android-arm64", ('validation.text="select-prose"',))


def test_reference_is_unquantized() -> None:
    r = load_recipe("reference-fp32")
    assert r.quantization.linear is None and r.quantization.embedding is None


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


BASE = 'name = "bad"\nbackend = "xnnpack"\n'


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (BASE + "colour = 3\n", "unknown key 'colour'"),
        (BASE + "[export]\nmax_seq_len = '512'\n", "export.max_seq_len: expected int"),
        (BASE + "[export]\nmax_seq_len = -4\n", "export.max_seq_len: must be > 0"),
        (
            BASE + "[quantization.linear]\ngroup_size = 32\nbits = 4\n",
            "unknown key 'quantization.linear.bits'",
        ),
        (BASE + "[quantization.linear]\nscheme = 'int3'\n", "quantization.linear.scheme: must be one of"),
        (BASE + "[quantization.embedding]\nbits = 5\n", "quantization.embedding.bits: must be one of"),
        (BASE + "[validation]\ngreedy_steps = 8\n", "validation.greedy_steps: must be >= 32"),
        (BASE + "[validation]\nprompts = 'def'\n", "validation.prompts: expected a list of strings"),
        (
            BASE + "[validation]\njudge_max_perplexity_ratio = 1.1\n",
            "validation.judge_max_perplexity_ratio: needs validation.judge_texts",
        ),
        (
            BASE + "[validation]\njudge_texts = ['other-code']\njudge_max_perplexity_ratio = 0.9\n",
            "validation.judge_max_perplexity_ratio: must be >= 1, got 0.9",
        ),
        ('name = "bad"\nbackend = "tflite"\n', "backend: must be one of"),
        ('backend = "xnnpack"\n', "required key name missing"),
        (BASE + "[export\n", "not valid TOML"),
        (BASE + "[quantization.linear]\nscheme = '8da8w'\n", "quantization.linear.group_size: 8da8w has one"),
        (BASE + "[quantization.mixed]\ncandidates = []\n", "quantization.mixed.candidates: must list"),
        (
            BASE + "[quantization.linear]\ngroup_size = 16\n",
            "quantization.linear.group_size: XNNPACK delegates multiples of 32, got 16",
        ),
        (
            BASE + "[quantization.mixed]\ncandidates = ['8da8w']\n",
            "quantization.mixed.candidates[0]: expected a table",
        ),
        (
            BASE + "[quantization.mixed]\ncandidates = [{scheme = '8da8w', group_size = 0, bits = 8}]\n",
            "unknown key 'quantization.mixed.candidates[0].bits'",
        ),
        (
            BASE + "[quantization.linear]\n[quantization.mixed]\ncandidates = [{group_size = 64}]\n"
            "text = 'prose-and-code'\n",
            "quantization.mixed.text: must be one of 'calibration'",
        ),
        (
            BASE + "[quantization.qat]\nsteps = 10\n",
            "quantization.qat: needs quantization.linear with scheme '8da4w'",
        ),
        (
            BASE + "[quantization.linear]\nscale_algorithm = 'hqq_scale_only'\n[quantization.qat]\n",
            "quantization.linear.scale_algorithm: QAT trains with 'affine'",
        ),
        (
            BASE + "[quantization.linear]\n[quantization.mixed]\n"
            "candidates = [{scheme = 'int4_weight_only', scale_algorithm = 'hqq'}]\n",
            "quantization.mixed.candidates[0].scheme: must be '8da4w' or '8da8w'",
        ),
    ],
)
def test_bad_recipe_names_file_and_key(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(_write(tmp_path, text))
    assert info.value.path is not None and info.value.path.name == "bad.toml"
    assert words in info.value.message


def test_missing_recipe_lists_shipped_ones() -> None:
    with pytest.raises(RecipeError, match=r"recipe not found.*android-arm64"):
        load_recipe("no-such-device")


def test_set_overrides_are_checked_like_the_file() -> None:
    r = load_recipe("android-arm64", ("quantization.linear.group_size=64", "export.max_seq_len=256"))
    assert r.quantization.linear is not None and r.quantization.linear.group_size == 64
    assert r.export.max_seq_len == 256
    with pytest.raises(RecipeError, match=r"quantization\.linear\.group_size: expected int"):
        load_recipe("android-arm64", ("quantization.linear.group_size=big",))
    with pytest.raises(RecipeError, match=r"unknown key .export\.speed."):
        load_recipe("android-arm64", ("export.speed=11",))


def test_set_false_switches_an_optional_table_off() -> None:
    r = load_recipe("android-arm64-qat", ("quantization.qat=false", "quantization.mixed=false"))
    assert r.quantization.qat is None and r.quantization.mixed is None
    assert r.quantization.linear is not None and r.quantization.linear.group_size == 32
    with pytest.raises(RecipeError, match=r"quantization\.qat: expected a table"):
        load_recipe("reference-fp32", ("quantization.qat=false",))


def test_group_size_must_divide_every_layer(tiny_checkpoint: Path) -> None:
    args = open_checkpoint(tiny_checkpoint).args  # hidden 64, intermediate 128
    r = load_recipe("android-arm64", ("quantization.linear.group_size=96",))
    with pytest.raises(RecipeError, match="group_size: 96 does not divide the input size 64"):
        check_fits(r, args, Path("android-arm64.toml"))
    r = load_recipe("android-arm64", ("quantization.embedding.group_size=128",))
    with pytest.raises(RecipeError, match=r"embedding\.group_size: 128 does not divide"):
        check_fits(r, args, Path("android-arm64.toml"))
    r = load_recipe("android-arm64", ("export.max_seq_len=4096",))
    with pytest.raises(RecipeError, match=r"exceeds the model.s max_position_embeddings 512"):
        check_fits(r, args, Path("android-arm64.toml"))


def test_digest_changes_with_content() -> None:
    a = load_recipe("android-arm64")
    b = load_recipe("android-arm64", ("quantization.linear.group_size=64",))
    assert a.digest() == load_recipe("android-arm64").digest() != b.digest()


# Escapes the fuzz tests (tests/fuzz/test_fuzz_recipe.py) found: each was another exception or a
# message over several lines before.


def test_name_too_long_for_the_os_is_a_recipe_error() -> None:
    with pytest.raises(RecipeError, match="cannot read the recipe"):
        load_recipe("x" * 5000)  # OSError (file name too long) from the existence check before


@pytest.mark.parametrize(
    "text",
    [
        BASE + "[export]\nmax_seq_len = " + "9" * 5000 + "\n",  # tomllib's int: a plain ValueError
        BASE + "v = " + "[" * 5000 + "]" * 5000 + "\n",  # tomllib recurses: RecursionError
    ],
    ids=["huge-integer", "deep-nesting"],
)
def test_toml_that_tomllib_refuses_oddly_is_a_recipe_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(_write(tmp_path, text))


@pytest.mark.parametrize("value", ["9" * 5000, "[" * 5000 + "]" * 5000])
def test_set_value_that_tomllib_refuses_oddly_is_a_recipe_error(value: str) -> None:
    with pytest.raises(RecipeError, match=r"--set export\.max_seq_len: not a valid value"):
        load_recipe("android-arm64", (f"export.max_seq_len={value}",))


def test_keys_with_newlines_are_named_on_one_line(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"unknown key 'a\\nb'") as info:
        load_recipe(_write(tmp_path, BASE + '"a\\nb" = 1\n'))
    assert "\n" not in info.value.message
    with pytest.raises(RecipeError, match=r"--set name\.\\n: 'name' is not a table") as info:
        load_recipe("android-arm64", ("name.\n=1",))
    assert "\n" not in info.value.message
