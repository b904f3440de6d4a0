"""Checkpoint loading: parity with Hugging Face transformers on checkpoints it wrote, and every kind of
bad checkpoint gets a CheckpointError naming the file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from exporter.errors import CheckpointError
from exporter.model.checkpoint import load_model, open_checkpoint

PARITY_TOL = 1e-4

LAYOUTS: dict[str, dict[str, Any]] = {
    # Llama 3.x: untied head, GQA, llama3 RoPE scaling
    "llama3": {
        "family": "llama",
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "rope_theta": 500000.0,
    },
    # SmolLM2: tied embeddings, full multi-head attention
    "smollm2": {"family": "llama", "tie_word_embeddings": True, "num_key_value_heads": 4},
    # TinyLlama: 4:1 grouped-query attention, untied
    "tinyllama": {"family": "llama", "num_key_value_heads": 1},
    # Qwen2/2.5: q/k/v bias, tied
    "qwen2": {"family": "qwen2", "tie_word_embeddings": True},
    # Qwen3: per-head q/k RMSNorm, head_dim not hidden_size / heads
    "qwen3": {"family": "qwen3", "head_dim": 32, "tie_word_embeddings": True},
    # bf16 weights in shards with an index
    "sharded-bf16": {"family": "llama", "dtype": torch.bfloat16, "max_shard_size": "100KB"},
    "fp16": {"family": "llama", "dtype": torch.float16},
}


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_eager_fp32_matches_transformers(make_checkpoint: Callable[..., Path], layout: str) -> None:
    folder = make_checkpoint(layout, **LAYOUTS[layout])
    ckpt = open_checkpoint(folder)
    model = load_model(ckpt, max_seq_len=64)
    tokens = torch.randint(0, ckpt.args.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    expected = hf_logits(folder, tokens)
    with torch.no_grad():
        full = model(tokens, torch.tensor([0]))
        model.reset_cache()
        # the same sequence as prefill + chunk + single-token decode through the KV cache
        parts = [model(tokens[:, :10], torch.tensor([0])), model(tokens[:, 10:23], torch.tensor([10]))]
        parts.append(model(tokens[:, 23:], torch.tensor([23])))
    assert (full - expected).abs().max().item() <= PARITY_TOL
    assert (torch.cat(parts, 1) - expected).abs().max().item() <= PARITY_TOL


def test_sharded_checkpoint_reads_every_shard(make_checkpoint: Callable[..., Path]) -> None:
    folder = make_checkpoint("shards", max_shard_size="100KB")
    ckpt = open_checkpoint(folder)
    assert len(ckpt.weight_files) > 1


def test_args_follow_config(tiny_checkpoint: Path) -> None:
    args = open_checkpoint(tiny_checkpoint).args
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.head_dim) == (64, 2, 4, 2, 16)
    model = load_model(open_checkpoint(tiny_checkpoint), 32)
    assert args.parameter_count() == sum(p.numel() for p in model.parameters())


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _expect(folder: Path, file: str, words: str, load: bool = False) -> None:
    with pytest.raises(CheckpointError) as info:
        ckpt = open_checkpoint(folder)
        if load:
            load_model(ckpt, 32)
    assert info.value.path is not None and info.value.path.name == file
    assert words in info.value.message


def test_missing_folder(tmp_path: Path) -> None:
    _expect(tmp_path / "nope", "nope", "checkpoint folder not found")


def test_missing_config(tiny_copy: Path) -> None:
    (tiny_copy / "config.json").unlink()
    _expect(tiny_copy, "config.json", "config.json missing")


def test_invalid_config_json(tiny_copy: Path) -> None:
    (tiny_copy / "config.json").write_text("{not json")
    _expect(tiny_copy, "config.json", "not valid JSON")


def test_unsupported_architecture(tiny_copy: Path) -> None:
    _edit_config(tiny_copy, architectures=["MambaForCausalLM"])
    _expect(tiny_copy, "config.json", "unsupported architecture 'MambaForCausalLM'")


def test_unsupported_rope_type(tiny_copy: Path) -> None:
    _edit_config(tiny_copy, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    _expect(tiny_copy, "config.json", "unsupported rope type 'yarn'")


def test_missing_field(tiny_copy: Path) -> None:
    path = tiny_copy / "config.json"
    config = json.loads(path.read_text())
    del config["hidden_size"]
    path.write_text(json.dumps(config))
    _expect(tiny_copy, "config.json", "'hidden_size' missing")


def test_missing_tokenizer(tiny_copy: Path) -> None:
    (tiny_copy / "tokenizer.json").unlink()
    _expect(tiny_copy, "tokenizer.json", "tokenizer file missing")


def test_no_weights(tiny_copy: Path) -> None:
    (tiny_copy / "model.safetensors").unlink()
    _expect(tiny_copy, "tiny-llama", "no *.safetensors")


def test_truncated_safetensors(tiny_copy: Path) -> None:
    path = tiny_copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    _expect(tiny_copy, "model.safetensors", "truncated or corrupt", load=True)


def test_corrupt_safetensors_header(tiny_copy: Path) -> None:
    path = tiny_copy / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"x" * 32
    path.write_bytes(bytes(data))
    _expect(tiny_copy, "model.safetensors", "truncated or corrupt", load=True)


def _rewrite_weights(folder: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_tensor(tiny_copy: Path) -> None:
    _rewrite_weights(tiny_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    _expect(tiny_copy, "model.safetensors", "missing tensor model.layers.1.mlp.up_proj.weight", load=True)


def test_wrong_tensor_shape(tiny_copy: Path) -> None:
    def shrink(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"][:32]

    _rewrite_weights(tiny_copy, shrink)
    _expect(tiny_copy, "model.safetensors", "has shape [32, 64]", load=True)


def test_unexpected_tensor(tiny_copy: Path) -> None:
    _rewrite_weights(tiny_copy, lambda t: t.update({"model.layers.0.mystery.weight": torch.zeros(2)}))
    _expect(tiny_copy, "model.safetensors", "unexpected tensor", load=True)


# Escapes the fuzz tests (tests/fuzz/test_fuzz_checkpoint.py) found: each was another exception, or a
# checkpoint that opened with sizes no model has, before.


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # RecursionError from json
        ('{"hidden_size": ' + "9" * 5000 + "}", "not valid JSON"),  # ValueError: int digit limit
    ],
    ids=["deep-nesting", "huge-integer"],
)
def test_json_that_json_refuses_oddly(tiny_copy: Path, text: str, words: str) -> None:
    (tiny_copy / "config.json").write_text(text)
    _expect(tiny_copy, "config.json", words)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"num_attention_heads": 0}, "'num_attention_heads' must be a positive"),  # ZeroDivisionError
        ({"num_key_value_heads": 0}, "'num_key_value_heads' must be a positive"),  # ZeroDivisionError
        ({"hidden_size": -64}, "'hidden_size' must be a positive"),  # opened with a negative size
        ({"vocab_size": 2**40}, "'vocab_size' must be a positive"),  # torch overflow at load
        ({"head_dim": [32]}, "'head_dim' must be int"),  # TypeError from int()
        ({"head_dim": None, "num_attention_heads": 128}, "hidden_size 64 is smaller than num_attention_"),
        ({"rms_norm_eps": float("nan")}, "'rms_norm_eps' must be a positive finite"),
        ({"rope_parameters": {"rope_theta": "big"}}, "'rope_theta' must be float"),  # ValueError
        ({"rope_parameters": [1, 2]}, "rope_parameters must be a JSON object"),  # TypeError from dict()
        ({"architectures": [["LlamaForCausalLM"]]}, "unsupported architecture"),  # unhashable list
        ({"tie_word_embeddings": "false"}, "must be true or false"),  # read as True before
    ],
)
def test_config_values_no_model_has(tiny_copy: Path, changes: dict[str, Any], words: str) -> None:
    _edit_config(tiny_copy, **changes)
    _expect(tiny_copy, "config.json", words)


@pytest.mark.parametrize(
    ("field", "value"),
    [("factor", 0), ("original_max_position_embeddings", 10**40), ("high_freq_factor", float("inf"))],
)
def test_llama3_rope_values_no_model_has(tiny_copy: Path, field: str, value: float) -> None:
    rope = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0, "low_freq_factor": 1.0}
    rope |= {"high_freq_factor": 4.0, "original_max_position_embeddings": 64, field: value}
    _edit_config(tiny_copy, rope_parameters=rope)
    _expect(tiny_copy, "config.json", f"llama3 rope scaling: field {field!r} must be a positive")


@pytest.mark.parametrize(
    "shard", ["../model.safetensors", "/etc/passwd", "sub/../model.safetensors", "..", ""]
)
def test_index_naming_files_outside_the_folder_is_refused(tiny_copy: Path, shard: str) -> None:
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": shard}}
    (tiny_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    _expect(tiny_copy, "model.safetensors.index.json", "is not a file name in the checkpoint folder")


@pytest.mark.parametrize("weight_map", [["model.safetensors"], {"a": 3}, None])
def test_index_with_a_malformed_weight_map(tiny_copy: Path, weight_map: Any) -> None:
    index = {"metadata": {}, "weight_map": weight_map}
    (tiny_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    _expect(tiny_copy, "model.safetensors.index.json", "weight_map must map tensor names to file names")


def test_index_naming_a_shard_too_long_for_the_os(tiny_copy: Path) -> None:
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "x" * 5000}}
    (tiny_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    _expect(tiny_copy, "x" * 5000, "weight shard listed in the index is missing")  # OSError before
