"""The model card (README.md) of a release's Hugging Face Hub-style folder, from the index entries."""

from __future__ import annotations

from typing import Any


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def _figure(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _row(e: dict[str, Any]) -> str:
    q, mem = e["quality"], e["memory_estimate_bytes"]
    path = f"{'xnnpack' if e['format'] == 'executorch-pte' else 'aoti'}/{e['target']}{e['file'][-4:]}"
    return (
        f"| `{path}` | {e['device']} | {_mb(e['size_bytes'])} | {_mb(mem['total'])} | "
        f"{_figure(q['perplexity_ratio_to_fp32'], '.3f')} | {_figure(q['top1_agreement_clear'], '.3f')} | "
        f"{', '.join(e['verified_on'])} | `{e['sha256'][:16]}` |"
    )


def model_card(model: str, entries: list[dict[str, Any]]) -> str:
    formats = sorted({e["format"] for e in entries})
    needs = entries[0]["runtime_needs"]
    lines = [
        "---",
        "library_name: executorch" if "executorch-pte" in formats else "library_name: pytorch",
        "tags: [executorch, xnnpack, aotinductor, quantized, int4]",
        "---",
        "",
        f"# {model}: on-device and server builds",
        "",
        "Built, validated and packaged by `exporter`. Every file below was checked against the eager",
        "model at build time (figures from its `manifest.json`) and re-verified before this release.",
        "",
        "| file | target | MB | memory MB (incl. KV cache) | perplexity ÷ fp32 | top-1 agreement "
        "(clear positions) | verified on | sha256 |",
        "|---|---|---|---|---|---|---|---|",
        *[_row(e) for e in entries],
        "",
        "## Loading",
        "",
        "- `.pte` (ExecuTorch "
        f"{needs.get('executorch_version', '')}): ExecuTorch's LLM runner (`TextLLMRunner`) with "
        "`tokenizer.json`; link the kernel libraries listed in each manifest's "
        "`runtime.kernel_libraries`.",
        "- `.pt2` (AOTInductor): `torch._inductor.aoti_load_package(path)` with the torch version "
        "and CPU ISA named in its manifest's `runtime`.",
        "- Each `<target>.manifest.json` holds everything a runtime needs: inputs, outputs, KV cache "
        "layout, BOS/EOS ids, chat template, memory estimate.",
        "",
        "## Checking a file",
        "",
        "`sha256sum -c SHA256SUMS` in the release folder; `exporter verify <artifact folder> [--key "
        "PUBLIC.pem]` on an unpacked archive re-checks every file, the signature and the golden vectors.",
        "",
    ]
    return "\n".join(lines)
