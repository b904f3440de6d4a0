"""One benchmark subject in its own process (see ``exporter.measure.bench``); prints one JSON line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from backends import Stepper

from ..artifact.load import load_artifact
from ..artifact.manifest import read_manifest
from ..build.pipeline import DEFAULT_CHECKPOINT, eager_module, stored_bytes
from ..gate.inputs import HELDOUT
from ..gate.steppers import eager_stepper
from ..model.checkpoint import open_checkpoint
from ..model.tokenizer import encode, load_tokenizer, tokenizer_info
from ..plumbing.memory import peak_rss_mb
from ..plumbing.native_logs import native_logs_captured
from ..recipe import ExportSettings, Quantization, recipe_from_dict


def prompt_ids(checkpoint: Path, n: int) -> list[int]:
    ckpt = open_checkpoint(checkpoint)
    tok = load_tokenizer(ckpt.tokenizer_path)
    text = (DEFAULT_CHECKPOINT / HELDOUT).read_text(encoding="utf-8")
    ids = encode(tok, tokenizer_info(ckpt.path, ckpt.config, tok), text * 4)[:n]
    return [i % ckpt.args.vocab_size for i in ids]


def load_subject(kind: str, target: str, checkpoint: Path | None) -> tuple[str, Stepper, dict[str, Any]]:
    if kind == "artifact":
        m = read_manifest(Path(target))
        step = load_artifact(Path(target), m)
        facts = {
            "file_bytes": m["artifact"]["size_bytes"],
            "bits_per_parameter": m["artifact"]["bits_per_parameter"],
            "weight_bytes": m["runtime"]["weight_bytes"],
        }
        return f"{m['recipe']['name']} ({m['artifact']['file']})", step, facts
    m = read_manifest(Path(target))
    recipe = recipe_from_dict(m["recipe"]["resolved"], Path(target) / "manifest.json")
    if kind == "eager-fp32":
        recipe = dataclasses.replace(
            recipe,
            quantization=Quantization(),
            export=ExportSettings(max_seq_len=recipe.export.max_seq_len, dtype="float32", custom_sdpa=False),
        )
    module = eager_module(recipe, open_checkpoint(checkpoint or DEFAULT_CHECKPOINT))
    weights = sum(stored_bytes(p) for p in module.parameters())
    name = "eager fp32" if kind == "eager-fp32" else f"eager {recipe.name}"
    return name, eager_stepper(module), {"weight_bytes": weights}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["artifact", "eager", "eager-fp32"])
    ap.add_argument("target")
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    start = time.perf_counter()
    with native_logs_captured():
        name, step, facts = load_subject(a.kind, a.target, a.checkpoint)
    load_s = time.perf_counter() - start
    ids = prompt_ids(a.checkpoint or DEFAULT_CHECKPOINT, a.prompt_tokens)
    prefill, decode = [], []
    with native_logs_captured(), torch.no_grad():
        for rep in range(a.repeats + 1):  # the first round warms up and is not counted
            t = time.perf_counter()
            logits = step(torch.tensor([ids]), torch.tensor([0]))
            t_prefill = time.perf_counter() - t
            token = int(logits[0].argmax())
            t = time.perf_counter()
            for i in range(a.decode_tokens):
                token = int(step(torch.tensor([[token]]), torch.tensor([len(ids) + i]))[0].argmax())
            t_decode = time.perf_counter() - t
            if rep:
                prefill.append(len(ids) / t_prefill)
                decode.append(a.decode_tokens / t_decode)
    print(
        json.dumps(
            {
                "name": name,
                "load_s": load_s,
                "prefill_tokens_per_s": prefill,
                "decode_tokens_per_s": decode,
                "peak_rss_mb": peak_rss_mb(),
                **facts,
            }
        )
    )


if __name__ == "__main__":
    main()
