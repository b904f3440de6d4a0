"""Generate from an artifact in its own runtime: ``.pte`` through ExecuTorch's ``TextLLMRunner``,
the runner Android and iOS apps use, so what we measure here is what an app gets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ArtifactError
from .manifest import read_manifest


@dataclass(frozen=True)
class Generation:
    text: str
    prefill_tokens: int
    prefill_tokens_per_s: float
    decode_tokens: int
    decode_tokens_per_s: float


def generate(artifact_dir: Path, prompt: str, max_new_tokens: int) -> Generation:
    manifest = read_manifest(artifact_dir)
    model_file = Path(artifact_dir) / manifest["artifact"]["file"]
    tokenizer = Path(artifact_dir) / manifest["tokenizer"]["file"]
    for path in (model_file, tokenizer):
        if not path.is_file():
            raise ArtifactError(path, "listed in manifest.json but missing")
    if manifest["artifact"]["format"] != "executorch-pte":
        raise ArtifactError(model_file, f"cannot play format {manifest['artifact']['format']!r}")
    return _run_text_llm_runner(model_file, tokenizer, prompt, max_new_tokens, manifest)


def _run_text_llm_runner(
    model_file: Path, tokenizer: Path, prompt: str, max_new_tokens: int, manifest: dict[str, Any]
) -> Generation:
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from .runtime import load_executorch_kernels, native_logs_captured

    load_executorch_kernels()
    try:
        with native_logs_captured():
            runner = TextLLMRunner(str(model_file), str(tokenizer))
    except RuntimeError as e:
        raise ArtifactError(model_file, f"TextLLMRunner cannot load it ({e})") from e
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        echo=False,
        num_bos=1 if manifest["tokenizer"]["add_bos"] else 0,
    )
    pieces: list[str] = []
    stats: list[dict[str, Any]] = []

    def on_stats(s: Any) -> None:
        stats.append(json.loads(s.to_json_string()))

    with native_logs_captured():
        try:
            runner.generate(prompt, config, token_callback=pieces.append, stats_callback=on_stats)
        except UnicodeDecodeError:
            # The binding hands each piece over as str; a byte-level piece that is not valid UTF-8
            # on its own cannot cross. Generate again without the callback to still get figures.
            pieces.append("\ufffd")
            runner.reset()
            stats.clear()
            runner.generate(prompt, config, stats_callback=on_stats)
    s = stats[-1]
    return Generation(
        text="".join(pieces),
        prefill_tokens=int(s["prompt_tokens"]),
        prefill_tokens_per_s=float(s["prefill_token_per_sec"]),
        decode_tokens=int(s["generated_tokens"]),
        decode_tokens_per_s=float(s["decode_token_per_sec"]),
    )
