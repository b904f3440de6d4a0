"""The peer race's pure parts: the params.json and the command line ExecuTorch's export_llm gets, and the
report table. Nothing is exported here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from exporter.model.checkpoint import config_to_args
from exporter.model.transformer import ModelArgs
from exporter.recipe import load_recipe
from tools.peer import SHAPES, markdown, params_json, peer_command


def shape_args(name: str) -> ModelArgs:
    return config_to_args(Path("config.json"), {**SHAPES[name], "max_position_embeddings": 2048}, "llama")


def executorch_args(params: dict[str, Any]) -> Any:
    """The ModelArgs export_llm builds from params.json (it passes the file's keys as keywords)."""
    from executorch.examples.models.llama.model_args import ModelArgs as ExecuTorchArgs

    return ExecuTorchArgs(max_seq_len=512, max_context_len=512, **params)


def test_llama3_scaling_reaches_the_peer() -> None:
    params = params_json(shape_args("llama-3.2-1b"))
    assert params["use_scaled_rope"] is True
    assert params["rope_scale_factor"] == 32 and params["high_freq_factor"] == 4
    assert params["rope_theta"] == 500000.0 and params["head_dim"] == 64
    assert "max_seq_len" not in params  # export_llm sets it; in params.json it would clash
    peer = executorch_args(params)
    assert peer.use_scaled_rope and peer.rope_scale_factor == 32  # not executorch's default 8
    assert peer.high_freq_factor == 4 and peer.rope_freq_base == 500000.0


def test_unscaled_rope_writes_no_factor() -> None:
    params = params_json(shape_args("smollm2-135m"))
    assert params["use_scaled_rope"] is False
    assert "rope_scale_factor" not in params and "high_freq_factor" not in params
    assert (params["dim"], params["n_layers"], params["n_kv_heads"]) == (576, 30, 3)
    assert executorch_args(params).use_scaled_rope is False


def test_rope_scaling_executorch_hard_codes_is_refused() -> None:
    args = shape_args("llama-3.2-1b")
    assert args.rope_scaling is not None
    other = dataclasses.replace(
        args, rope_scaling=dataclasses.replace(args.rope_scaling, low_freq_factor=2.0)
    )
    with pytest.raises(ValueError, match="low_freq_factor"):
        params_json(other)


def _command(recipe: str, *overrides: str) -> list[str]:
    out = Path("work/peer")
    return peer_command(
        Path("m.pth"), Path("params.json"), out, {"get_bos_id": 0}, load_recipe(recipe, overrides)
    )


def _hydra_values(cmd: list[str]) -> dict[str, Any]:
    """The command's overrides as export_llm's Hydra parses them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(
        [a for a in cmd[3:] if not a.startswith("base.metadata")]
    )
    return {o.key_or_group: o.value() for o in parsed}


def test_peer_command_takes_the_recipe_settings() -> None:
    cmd = _command("android-arm64")
    assert "quantization.embedding_quantize='4,32'" in cmd
    values = _hydra_values(cmd)
    assert values["quantization.embedding_quantize"] == "4,32"  # one string, not a Hydra list
    assert values["export.max_seq_length"] == 512 and values["export.max_context_length"] == 512
    assert values["quantization.qmode"] == "8da4w" and values["quantization.group_size"] == 32
    assert values["quantization.use_hqq"] is False  # the recipe's affine scales, not the peer's HQQ
    assert values["base.model_class"] == "llama3"  # keeps params.json's rope_scale_factor
    # absolute: export_llm runs inside its output folder
    assert values["export.output_name"] == str(Path("work/peer/model.pte").resolve())
    assert values["base.checkpoint"] == str(Path("m.pth").resolve())


def test_peer_command_follows_overrides() -> None:
    cmd = _command(
        "android-arm64",
        "export.max_seq_len=256",
        "quantization.embedding.bits=8",
        "quantization.embedding.group_size=64",
        "quantization.linear.group_size=64",
    )
    values = _hydra_values(cmd)
    assert values["quantization.embedding_quantize"] == "8,64"
    assert values["export.max_seq_length"] == 256 and values["export.max_context_length"] == 256
    assert values["quantization.group_size"] == 64


def test_peer_command_refuses_a_recipe_it_cannot_match() -> None:
    with pytest.raises(ValueError, match="XNNPACK"):
        _command("server-x86-int4")


def _race(name: str, perplexity: bool) -> dict[str, Any]:
    row = {
        "export_wall_s": 10.0,
        "export_peak_rss_mb": 900.0,
        "pte_mb": 45.6,
        "prefill_tokens_per_s": 500.0,
        "decode_tokens_per_s": 80.0,
    }
    if perplexity:
        row |= {"perplexity_ratio_prose": 1.08, "perplexity_ratio_code": 1.04}
        row |= {"perplexity_ratio_other-prose": 1.12, "perplexity_ratio_other-code": 1.1}
    race: dict[str, Any] = {"checkpoint": f"ckpts/{name}", "parameters": 4.2e6}
    race |= {"ours": row, "peer": row, "ours_over_peer": {k: 1.0 for k in row}}
    return race | ({"fp32_perplexity": {"prose": 12.5, "code": 3.25}} if perplexity else {})


def test_markdown_leaves_random_weight_perplexity_blank() -> None:
    text = markdown([_race("pycode-4m", True), _race("llama-3.2-1b", False)])
    lines = text.splitlines()
    random_rows = [line for line in lines if line.startswith("| llama-3.2-1b |")]
    real_rows = [line for line in lines if line.startswith("| pycode-4m |")]
    assert len(random_rows) == 3 and len(real_rows) == 3
    assert [row.count("—") for row in random_rows] == [4, 4, 4]
    assert random_rows[1].endswith("| peer | 10 | 900 | 45.6 | 500 | 80 | — | — | — | — |"), random_rows[1]
    assert real_rows[0].endswith("| 80 | 1.08 | 1.04 | 1.12 | 1.1 |"), real_rows[0]
    assert "pycode-4m: fp32 eager perplexity prose 12.5, code 3.25" in text
    assert "llama-3.2-1b: random weights, perplexity not reported" in text


def test_random_shapes_race_every_recipe_untuned() -> None:
    from exporter.recipe import load_recipe
    from tools.peer import untuned

    assert untuned("android-arm64") == ("quantization.gptq=false",)
    assert untuned("android-arm64-qat") == ("quantization.mixed=false", "quantization.qat=false")
    assert untuned("reference-fp32") == ()
    for name in ("android-arm64", "android-arm64-qat"):
        q = load_recipe(name, untuned(name)).quantization
        assert q.gptq is None and q.mixed is None and q.qat is None


def test_random_shapes_lift_the_judged_bar_only_where_a_recipe_sets_one() -> None:
    """Random weights have no quality to judge: the bar goes off, and the overrides still load
    for recipes without judged texts (a bar there would be refused)."""
    from exporter.recipe import load_recipe
    from tools.peer import RANDOM_WEIGHT_GATE, random_weight_gate

    assert random_weight_gate("android-arm64") == (
        *RANDOM_WEIGHT_GATE,
        "validation.judge_max_perplexity_ratio=1e9",
    )
    assert random_weight_gate("reference-fp32") == RANDOM_WEIGHT_GATE
    for name in ("android-arm64", "reference-fp32"):
        load_recipe(name, random_weight_gate(name))


@pytest.mark.parametrize(
    ("family", "extra"),
    [("llama", {}), ("qwen2", {}), ("qwen3", {"perturb": True})],
)
def test_the_peer_runs_the_same_model(tmp_path: Path, family: str, extra: dict[str, Any]) -> None:
    """The params.json and Meta state the race hands export_llm give executorch's own Llama model
    our logits (Llama's interleaved layout, Qwen2's biases, Qwen3's q/k norms in the HF layout)."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer

    from exporter.model.checkpoint import load_model, open_checkpoint
    from tests.conftest import write_hf_checkpoint
    from tools.peer import meta_state

    ckpt = open_checkpoint(write_hf_checkpoint(tmp_path / family, family, **extra))
    params = params_json(ckpt.args)
    peer = construct_transformer(
        executorch_args(params | {"use_kv_cache": False, "generate_full_logits": True})
    ).eval()
    missing, unexpected = peer.load_state_dict(meta_state(ckpt), strict=False)
    assert not unexpected and all("rope" in k or "freqs" in k for k in missing), (missing, unexpected)
    tokens = torch.randint(0, ckpt.args.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    ours = load_model(ckpt, 64)
    with torch.no_grad():
        expected = ours(tokens, torch.tensor([0]))
        got = peer(tokens)
    assert torch.allclose(got, expected, atol=1e-4), float((got - expected).abs().max())


def test_what_the_peer_model_lacks_is_refused(tmp_path: Path) -> None:
    from exporter.model.checkpoint import open_checkpoint
    from tests.conftest import write_hf_checkpoint

    ckpt = open_checkpoint(write_hf_checkpoint(tmp_path / "g", "gemma3"))
    with pytest.raises(ValueError, match="the peer's Llama model"):
        params_json(ckpt.args)
