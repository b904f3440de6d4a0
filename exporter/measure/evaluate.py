"""``exporter eval``: teacher-forced quality of an artifact in its own runtime, against eager fp32 on
the same text: perplexity of both, top-1 agreement and mean KL(fp32 || artifact) per token.

Windows of the cache length up to ``max_tokens`` scored tokens, fp32 streamed from the checkpoint,
a bootstrap interval on the ratio: ``gate.judge``, which the build runs on the recipe's judging
texts too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..artifact.load import load_artifact
from ..artifact.manifest import read_manifest, write_json_atomically
from ..build.pipeline import DEFAULT_CHECKPOINT
from ..errors import ArtifactError
from ..gate.inputs import text_path as gate_text
from ..gate.judge import judge
from ..model.checkpoint import digest_files, open_checkpoint
from ..model.tokenizer import encode, load_tokenizer, tokenizer_info
from ..plumbing.native_logs import native_logs_captured
from ..recipe import ValidationSettings

EVAL_SUFFIX = ".eval.json"


def evaluate(
    artifact_dir: Path,
    text_file: Path | None = None,
    checkpoint: Path | None = None,
    max_tokens: int = 2048,
) -> dict[str, Any]:
    """Figures for ``artifact_dir``; also filed beside it (``eval_path``), by text."""
    manifest = read_manifest(artifact_dir)
    ckpt = open_checkpoint(checkpoint or DEFAULT_CHECKPOINT)
    files = [ckpt.path / "config.json", *ckpt.weight_files, ckpt.tokenizer_path]
    if digest_files(files) != manifest["model"]["checkpoint_sha256"]:
        raise ArtifactError(
            ckpt.path, f"is not the checkpoint {manifest['model']['name']!r} was built from (digest differs)"
        )
    gate = manifest["recipe"]["resolved"]["validation"]
    # a shipped text's name (prose, code, prose-and-code) or a path; default: the gate's own
    text_path, text_name = gate_text(str(text_file) if text_file else gate.get("text", ""), ckpt.path)
    clear_margin = float(gate.get("clear_margin", ValidationSettings().clear_margin))
    try:
        text = text_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError(text_path, f"cannot read text ({e})") from e
    tok = load_tokenizer(ckpt.tokenizer_path)
    ids = encode(tok, tokenizer_info(ckpt.path, ckpt.config, tok), text)
    if len(ids) < 2:
        raise ArtifactError(text_path, "text is too short to score (needs two tokens)")
    with native_logs_captured():
        step = load_artifact(Path(artifact_dir), manifest)
        figures = judge(
            ckpt, step, {text_name: ids}, manifest["runtime"]["max_seq_len"], max_tokens, clear_margin
        )
    result = {"text": text_name, **figures[text_name]}
    _record(Path(artifact_dir), manifest, result)
    return result


def eval_path(folder: Path) -> Path:
    """Where ``exporter eval`` files its results: beside the artifact folder, never inside it (the
    folder is sealed by its manifest and may be signed)."""
    folder = Path(folder)
    return folder.with_name(folder.name + EVAL_SUFFIX)


def read_evals(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Results filed for this very artifact (a rebuilt artifact's old results are ignored)."""
    path = eval_path(folder)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(path, f"unreadable eval record ({e}); delete it to start afresh") from e
    if not isinstance(data, dict) or data.get("artifact_sha256") != manifest["artifact"]["sha256"]:
        return {}
    results: dict[str, Any] = data.get("results", {})
    return results


def _record(folder: Path, manifest: dict[str, Any], result: dict[str, Any]) -> None:
    """One entry per text scored (a later score of the same text replaces it)."""
    results = {**read_evals(folder, manifest), result["text"]: result}
    record = {"artifact_sha256": manifest["artifact"]["sha256"], "results": results}
    write_json_atomically(eval_path(folder), record)
