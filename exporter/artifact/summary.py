"""A one-screen summary of an artifact, from its manifest and the model file beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..plumbing.hashing import sha256_file
from .folder import BUILD_INFO
from .manifest import listed_file, read_build_info, read_manifest


def summarize(artifact_dir: Path) -> dict[str, Any]:
    m = read_manifest(artifact_dir)
    model_file = listed_file(artifact_dir, m, "artifact")
    intact = sha256_file(model_file) == m["artifact"]["sha256"]
    rt, val = m["runtime"], m["validation"]
    vs_fp32, vs_eager = val["vs_fp32"], val["vs_eager"]
    summary: dict[str, Any] = {
        "model": m["model"]["name"],
        "architecture": m["model"]["architecture"],
        "parameters": m["model"]["parameters"],
        "recipe": m["recipe"]["name"],
        "file": f"{m['artifact']['file']} ({m['artifact']['format']})",
        "size_mb": round(m["artifact"]["size_bytes"] / 1e6, 3),
        "bits_per_parameter": m["artifact"]["bits_per_parameter"],
        "weight_bytes_per_parameter": m["artifact"].get("weight_bytes_per_parameter"),
        "sha256_matches_manifest": intact,
        "delegates": ", ".join(rt.get("delegates", [])) or "none",
        "delegated_node_share": rt.get("delegated_node_share"),
        "ops_outside_delegate": ", ".join(rt.get("operators_outside_delegate", [])),
        "max_seq_len": rt["max_seq_len"],
        "memory_estimate_mb": round(rt["memory_estimate_bytes"]["total"] / 1e6, 2),
        "greedy_identical_steps": f"{vs_eager['greedy_tokens_identical_min']}/{vs_eager['steps']}",
        "greedy_flips_at_ties": vs_eager.get("mismatches_at_ties", 0),
        "max_logit_abs_diff": round(vs_eager["max_logit_abs_diff"], 6),
        "max_logit_error_vs_eager": f"{vs_eager['max_logit_error']:.3g} x eager's logit spread",
        "kl_vs_eager": f"{vs_eager['heldout_mean_kl']:.3g} nats/token",
        "top1_agreement_vs_fp32": _agreement(vs_fp32["artifact"]),
        "perplexity": f"{vs_fp32['artifact']['perplexity']:.3f} (fp32 {vs_fp32['fp32_perplexity']:.3f})",
        "validation_text": val["text"]["source"],
        "chat_template": "yes" if m["tokenizer"].get("chat_template") else "none",
        "precision": _precision(m.get("quantization", {})),
    }
    if (Path(artifact_dir) / BUILD_INFO).is_file():  # the build's record, if it travelled along
        timings = read_build_info(artifact_dir)["timings"]
        summary["build_seconds"] = round(sum(t["seconds"] for t in timings.values()), 1)
    return summary


def _agreement(figures: dict[str, Any]) -> str:
    clear, every = figures["top1_agreement_clear"], figures["top1_agreement"]
    at_clear = "no" if clear is None else f"{clear:.4f} at"
    return f"{at_clear} {figures['clear_positions']} clear positions ({every:.4f} at all)"


def _precision(quantization: dict[str, Any]) -> str:
    """Parameters per precision, and how the tuning chose them."""
    summary = quantization.get("precision", {}).get("summary", {})
    total = sum(v["parameters"] for v in summary.values()) or 1
    parts = [f"{label} {v['parameters'] / total:.0%}" for label, v in summary.items()]
    tuning = quantization.get("tuning", {})
    if "mixed" in tuning:
        parts.append(f"{tuning['mixed']['raised']} linears raised by measured sensitivity")
    if "qat" in tuning:
        parts.append(f"QAT {tuning['qat']['steps']} steps in {tuning['qat']['seconds']:.0f} s")
    return "; ".join(parts) or "unknown"
