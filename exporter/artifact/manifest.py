"""The manifest: what an artifact is, how it was made, how well it matches the reference and what a
runtime needs to load it. Versioned with ``schema_version``; an app team loads from it alone."""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import ArtifactError
from .folder import BUILD_INFO, MANIFEST, write_records

# 2: tokenizer facts as transformers applies them (add_bos from the post-processor, special tokens,
# generation defaults), the gate's scale-free figures and its text.
# 3: a ``quantization`` section: every linear and embedding weight's precision, and for tuned
# recipes the mixed-precision plan and the quantization-aware training (text digest, steps, seed).
# 4: sealed (``seal``), ``files`` (sha256 and size of every file), golden vectors (golden.json);
# timings and tuning wall times moved to build-info.json, so identical builds give identical bytes.
SCHEMA_VERSION = 4

# Where each operator namespace outside the delegate comes from, for the app team's link line.
KERNEL_LIBRARIES = {
    "llama": "ExecuTorch LLM custom ops (extension/llm/custom_ops, link custom_ops; in Python "
    "import executorch.extension.llm.custom_ops.custom_ops)",
    "quantized_decomposed": "ExecuTorch quantized kernels (kernels/quantized, link "
    "quantized_ops_lib; in Python import executorch.kernels.quantized)",
    "aten": "ExecuTorch portable or optimized kernels (portable_ops_lib / optimized_native_cpu_ops_lib)",
    "executorch_prim": "ExecuTorch runtime built-ins",
}


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("exporter", "torch", "executorch", "torchao"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return versions


def kernel_libraries(operators: list[str]) -> list[str]:
    namespaces = sorted({op.split("::", 1)[0] for op in operators})
    return [KERNEL_LIBRARIES.get(ns, f"library providing {ns}:: operators") for ns in namespaces]


def write_json_atomically(path: Path, data: dict[str, Any]) -> Path:
    """Write beside ``path`` and rename: a reader sees the old file or the whole new one, also after
    a power loss (the file is fsynced before the rename, its folder after it)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        f.write(json.dumps(data, indent=2, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return path


def write_manifest(folder: Path, manifest: dict[str, Any], build_info: dict[str, Any]) -> Path:
    """The sealed manifest (with ``files``) and build-info.json, once every other file is in ``folder``."""
    return write_records(folder, {"schema_version": SCHEMA_VERSION, **manifest}, build_info)


def listed_file(folder: Path, manifest: dict[str, Any], section: str) -> Path:
    """The file a manifest section ("artifact", "tokenizer") names, which must be beside it."""
    path = Path(folder) / manifest[section]["file"]
    if not path.is_file():
        raise ArtifactError(path, "listed in manifest.json but missing")
    return path


def check_torch_matches(manifest: dict[str, Any], model_file: Path) -> None:
    """An AOTInductor package runs only with the torch it was compiled by: say so, don't crash."""
    import torch

    built = manifest["runtime"].get("torch_version")
    if manifest["artifact"]["format"] == "aoti-pt2" and built != torch.__version__:
        raise ArtifactError(
            model_file, f"compiled with torch {built}, this environment has torch {torch.__version__}"
        )


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(folder, "not an artifact folder (no manifest.json)") from None
    except OSError as e:  # a name the OS refuses (too long), a manifest.json that is a folder
        raise ArtifactError(path, f"cannot read ({e.strerror or e})") from e
    except RecursionError as e:  # json's parser recurses
        raise ArtifactError(path, "not valid JSON (nested too deeply)") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, integers past the digit limit
        raise ArtifactError(path, f"not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ArtifactError(path, f"expected a JSON object, got {type(data).__name__}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(
            path, f"schema_version {data.get('schema_version')!r}, this exporter reads {SCHEMA_VERSION}"
        )
    return data


def read_build_info(folder: Path) -> dict[str, Any]:
    """The build's record beside its manifest: timings, tuning wall times, host."""
    path = Path(folder) / BUILD_INFO
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(path, "missing (built by an exporter older than schema 4?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(path, f"not valid JSON ({e})") from e
    return data
