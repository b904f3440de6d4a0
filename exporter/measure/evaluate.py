"""``exporter eval``: teacher-forced quality of an artifact in its own runtime, against eager fp32 on
the same text: perplexity of both, top-1 agreement and mean KL(fp32 || artifact) per token.

The text is scored in consecutive windows of the artifact's cache length (each from position 0)
up to ``max_tokens`` scored tokens; the fp32 logits are streamed from the checkpoint a block at a
time (``gate.reference``), so a 3B model is never held whole. The perplexity ratio comes with a
95% interval from a block bootstrap over runs of ``BOOTSTRAP_BLOCK`` consecutive tokens (tokens
next to each other are not independent draws), so a reader sees whether a difference between two
artifacts is larger than the text's own noise."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..artifact.load import load_artifact
from ..artifact.manifest import read_manifest, write_json_atomically
from ..build.pipeline import DEFAULT_CHECKPOINT
from ..errors import ArtifactError
from ..gate.inputs import text_path as gate_text
from ..gate.reference import streamed_logits
from ..gate.steppers import score
from ..gate.validate import top2_margin
from ..model.checkpoint import digest_files, open_checkpoint
from ..model.tokenizer import encode, load_tokenizer, tokenizer_info
from ..plumbing.native_logs import native_logs_captured
from ..recipe import ValidationSettings

EVAL_SUFFIX = ".eval.json"
BOOTSTRAP_BLOCK = 32
BOOTSTRAP_SAMPLES = 2000


def token_figures(
    logits: torch.Tensor, reference: torch.Tensor, targets: torch.Tensor, clear_margin: float
) -> dict[str, torch.Tensor]:
    """Per scored token: both negative log-likelihoods, KL(fp32 || artifact), top-1 agreement, and
    whether fp32's own top-2 margin is clear."""
    art, ref = F.log_softmax(logits.float(), -1), F.log_softmax(reference.float(), -1)
    return {
        "nll": -art.gather(1, targets[:, None])[:, 0],
        "nll_fp32": -ref.gather(1, targets[:, None])[:, 0],
        "kl": (ref.exp() * (ref - art)).sum(-1),
        "agree": (logits.argmax(-1) == reference.argmax(-1)).float(),
        "clear": top2_margin(reference) >= clear_margin,
    }


def ratio_interval(nll: torch.Tensor, nll_fp32: torch.Tensor, seed: int = 0) -> tuple[float, float] | None:
    """95% block-bootstrap interval of exp(mean(nll - nll_fp32)), the perplexity ratio (None under
    two blocks of tokens)."""
    diff = (nll - nll_fp32).double()
    blocks = diff[: len(diff) // BOOTSTRAP_BLOCK * BOOTSTRAP_BLOCK].view(-1, BOOTSTRAP_BLOCK).mean(1)
    if len(blocks) < 2:
        return None
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(blocks), (BOOTSTRAP_SAMPLES, len(blocks)), generator=g)
    ratios = blocks[picks].mean(1).exp()
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return low, high


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
    ids = encode(tok, tokenizer_info(ckpt.path, ckpt.config, tok), text)[: max_tokens + 1]
    if len(ids) < 2:
        raise ArtifactError(text_path, "text is too short to score (needs two tokens)")
    length = manifest["runtime"]["max_seq_len"]  # a window of L ids scores L - 1 tokens
    windows = [ids[s : s + length] for s in range(0, len(ids) - 1, length - 1)]
    windows = [w for w in windows if len(w) >= 2]
    parts: list[dict[str, torch.Tensor]] = []
    with native_logs_captured():
        step = load_artifact(Path(artifact_dir), manifest)
        for window, reference in zip(windows, streamed_logits(ckpt, windows), strict=True):
            logits = score(step, window)
            parts.append(token_figures(logits, reference, torch.tensor(window[1:]), clear_margin))
    f = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    interval = ratio_interval(f["nll"], f["nll_fp32"])
    clear = f["clear"]
    result = {
        "text": text_name,
        "tokens_scored": len(f["nll"]),
        "windows": len(windows),
        "artifact_perplexity": math.exp(float(f["nll"].mean())),
        "fp32_perplexity": math.exp(float(f["nll_fp32"].mean())),
        "perplexity_ratio": math.exp(float((f["nll"] - f["nll_fp32"]).mean())),
        "perplexity_ratio_interval": None if interval is None else list(interval),
        "top1_agreement": float(f["agree"].mean()),
        "top1_agreement_clear": float(f["agree"][clear].mean()) if bool(clear.any()) else None,
        "clear_positions": int(clear.sum()),
        "mean_kl": float(f["kl"].mean()),
    }
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
