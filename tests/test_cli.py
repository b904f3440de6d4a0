"""The command line: bad input is one line on stderr, exit code 2, no traceback, nothing published."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from exporter.cli import main
from tests.model.test_checkpoint import _rewrite_weights


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]


def test_recipes_lists_shipped() -> None:
    code, out, _ = run("recipes")
    assert code == 0
    for name in ("android-arm64", "ios-arm64", "linux-arm64", "reference-fp32"):
        assert name in out


def test_help_names_every_command() -> None:
    code, out, _ = run("--help")
    assert code == 0 and all(c in out for c in ("build", "run", "inspect", "recipes"))


def _break_config(folder: Path) -> None:
    (folder / "config.json").write_text("{")


def _drop_config(folder: Path) -> None:
    (folder / "config.json").unlink()


def _unsupported(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))


def _truncate(folder: Path) -> None:
    p = folder / "model.safetensors"
    p.write_bytes(p.read_bytes()[:1000])


def _drop_tensor(folder: Path) -> None:
    _rewrite_weights(folder, lambda t: t.pop("model.norm.weight"))


def _bad_shape(folder: Path) -> None:
    _rewrite_weights(folder, lambda t: t.update({"model.norm.weight": t["model.norm.weight"][:5]}))


def _nan_weight(folder: Path) -> None:
    def poison(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.1.mlp.down_proj.weight"][3, 7] = float("nan")

    _rewrite_weights(folder, poison)


def _inf_embedding(folder: Path) -> None:
    _rewrite_weights(folder, lambda t: t["model.embed_tokens.weight"].__setitem__((0, 0), float("inf")))


def _drop_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()


BREAKAGES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "invalid config": (_break_config, "config.json", "not valid JSON"),
    "missing config": (_drop_config, "config.json", "config.json missing"),
    "unsupported architecture": (_unsupported, "config.json", "unsupported architecture 'GPT2LMHeadModel'"),
    "truncated safetensors": (_truncate, "model.safetensors", "truncated or corrupt"),
    "missing tensor": (_drop_tensor, "model.safetensors", "missing tensor model.norm.weight"),
    "wrong shape": (_bad_shape, "model.safetensors", "has shape [5]"),
    "missing tokenizer": (_drop_tokenizer, "tokenizer.json", "tokenizer file missing"),
    "NaN weight": (_nan_weight, "model.safetensors", "'model.layers.1.mlp.down_proj.weight' holds NaN"),
    "Inf weight": (_inf_embedding, "model.safetensors", "'model.embed_tokens.weight' holds NaN or Inf"),
}


@pytest.mark.parametrize("case", sorted(BREAKAGES))
def test_bad_checkpoint(case: str, tiny_checkpoint: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(tiny_checkpoint, tmp_path / "ck"))
    breakage, file, words = BREAKAGES[case]
    breakage(folder)
    out = tmp_path / "out"
    code, _, err = run("build", "reference-fp32", "--checkpoint", str(folder), "--out", str(out))
    assert_one_line_error(code, err, file, words)
    assert not (out / "ck" / "reference-fp32").exists()
    assert not out.exists() or not any((out / "ck").iterdir())


def test_missing_checkpoint_folder(tmp_path: Path) -> None:
    code, _, err = run("build", "android-arm64", "--checkpoint", str(tmp_path / "none"))
    assert_one_line_error(code, err, "none", "checkpoint folder not found")


def test_recipe_error(tmp_path: Path) -> None:
    bad = tmp_path / "mine.toml"
    bad.write_text('name = "mine"\nbackend = "xnnpack"\n[export]\nmax_seq_len = "long"\n')
    code, _, err = run("build", str(bad), "--out", str(tmp_path))
    assert_one_line_error(code, err, "mine.toml", "export.max_seq_len: expected int")


def test_group_size_that_does_not_divide(tiny_checkpoint: Path, tmp_path: Path) -> None:
    code, _, err = run(
        "build",
        "android-arm64",
        "--checkpoint",
        str(tiny_checkpoint),
        "--out",
        str(tmp_path),
        "--set",
        "quantization.linear.group_size=96",
    )
    assert_one_line_error(code, err, "android-arm64.toml", "group_size: 96 does not divide")


def test_unknown_recipe() -> None:
    code, _, err = run("build", "pager-mips")
    assert_one_line_error(code, err, "pager-mips.toml", "recipe not found")


def test_bad_set_syntax() -> None:
    code, _, err = run("build", "android-arm64", "--set", "nonsense")
    assert_one_line_error(code, err, "expected key=value")


def test_unwritable_output_folder(tiny_checkpoint: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = run(
        "build", "reference-fp32", "--checkpoint", str(tiny_checkpoint), "--out", str(blocker / "x")
    )
    assert_one_line_error(code, err, "output folder is not writable")


def test_run_and_inspect_on_a_non_artifact(tmp_path: Path) -> None:
    for cmd in (("run", str(tmp_path), "--prompt", "x"), ("inspect", str(tmp_path))):
        code, _, err = run(*cmd)
        assert_one_line_error(code, err, "not an artifact folder")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--debug", "inspect", str(tmp_path)])
    assert result.exit_code != 0 and result.exception is not None


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (("export.max_seq_len=128",), "validation.eval_tokens: 256 + 1 exceeds export.max_seq_len 128"),
        (
            ("export.max_seq_len=40", "validation.eval_tokens=16", "validation.greedy_steps=35"),
            "validation.prompts[2]: 11 prompt tokens + validation.greedy_steps 35 exceed "
            "export.max_seq_len 40",
        ),
        (("validation.eval_tokens=100000", "export.max_seq_len=512"), "validation.eval_tokens: 100000"),
        (("validation.text=no-such-text",), "validation.text: cannot read no-such-text"),
        (
            ("validation.text=prose-and-code", "validation.eval_tokens=5000", "export.max_seq_len=8000"),
            "exceeds the model's max_position_embeddings",
        ),
    ],
)
def test_lengths_and_text_are_checked_up_front(
    overrides: tuple[str, ...], words: str, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    args = ["build", "reference-fp32", "--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path)]
    for item in overrides:
        args += ["--set", item]
    code, _, err = run(*args)
    assert_one_line_error(code, err, "reference-fp32.toml", words)
    assert not any(tmp_path.iterdir())


def test_short_text_is_an_error_naming_the_key(tiny_checkpoint: Path, tmp_path: Path) -> None:
    text = tmp_path / "short.txt"
    text.write_text("def f(): pass\n")
    code, _, err = run(
        "build",
        "reference-fp32",
        "--checkpoint",
        str(tiny_checkpoint),
        "--out",
        str(tmp_path / "out"),
        "--set",
        f"validation.text={text}",
    )
    assert_one_line_error(
        code, err, "validation.text", "short.txt has", "tokens, validation.eval_tokens needs 257"
    )


def test_inspect_summarizes_a_built_artifact(tiny_artifact: Path) -> None:
    code, out, err = run("inspect", str(tiny_artifact), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["sha256_matches_manifest"] and summary["validation_text"] == "checkpoint:heldout.txt"
    assert "clear positions" in summary["top1_agreement_vs_fp32"]


def test_chat_without_a_template_is_a_one_line_error(tiny_artifact: Path) -> None:
    code, _, err = run("run", str(tiny_artifact), "--chat", "hello")
    assert_one_line_error(code, err, "manifest.json", "no chat template")


@pytest.mark.parametrize(
    "args", [(), ("--prompt", "x", "--chat", "y"), ("--prompt", "x", "--system", "be brief")]
)
def test_run_takes_exactly_one_kind_of_prompt(tiny_artifact: Path, args: tuple[str, ...]) -> None:
    code, _, err = run("run", str(tiny_artifact), *args)
    assert code == 2 and "--chat" in err and "Traceback" not in err
