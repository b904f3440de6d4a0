"""Generate from an artifact in its own runtime: ``.pte`` through ExecuTorch's ``TextLLMRunner``,
the runner Android and iOS apps use, so what we measure here is what an app gets; ``.pt2`` through
AOTInductor's package loader with the same greedy loop a server would run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifact.manifest import check_torch_matches, listed_file, read_manifest
from ..errors import ArtifactError


@dataclass(frozen=True)
class Generation:
    text: str
    prefill_tokens: int
    prefill_tokens_per_s: float
    decode_tokens: int
    decode_tokens_per_s: float
    stopped_at_eos: bool = False


@dataclass(frozen=True)
class Prompt:
    """What is fed to the artifact: text, and whether the tokenizer's special tokens (BOS) are
    added to it. A raw prompt gets them as the checkpoint's tokenizer adds them; a rendered chat
    prompt already holds every special token its template writes, as in transformers'
    ``apply_chat_template``."""

    text: str
    add_special_tokens: bool


def chat_prompt(manifest: dict[str, Any], message: str, system: str | None, source: Path) -> Prompt:
    """``message`` (and ``system``) rendered with the artifact's chat template, generation prompt on."""
    t = manifest["tokenizer"]
    if not t.get("chat_template"):
        raise ArtifactError(source, "the checkpoint has no chat template; use --prompt for raw text")
    from ..model.chat import chat_messages, render_chat

    text = render_chat(
        t["chat_template"], chat_messages(message, system), t.get("special_tokens", {}), source=source
    )
    return Prompt(text, add_special_tokens=False)


def generate(
    artifact_dir: Path, prompt: str, max_new_tokens: int, chat: bool = False, system: str | None = None
) -> Generation:
    """Greedy generation from ``prompt`` (raw text), or with ``chat`` from the user message
    ``prompt`` rendered with the checkpoint's chat template; stops at the artifact's EOS ids."""
    manifest = read_manifest(artifact_dir)
    model_file = listed_file(artifact_dir, manifest, "artifact")
    tokenizer = listed_file(artifact_dir, manifest, "tokenizer")
    fed = (
        chat_prompt(manifest, prompt, system, artifact_dir / "manifest.json")
        if chat
        else Prompt(prompt, True)
    )
    fmt = manifest["artifact"]["format"]
    if fmt == "executorch-pte":
        return _run_text_llm_runner(model_file, tokenizer, fed, max_new_tokens, manifest)
    if fmt == "aoti-pt2":
        check_torch_matches(manifest, model_file)
        return _run_pt2(model_file, tokenizer, fed, max_new_tokens, manifest)
    raise ArtifactError(model_file, f"cannot play format {fmt!r}")


def _run_pt2(
    model_file: Path, tokenizer_file: Path, prompt: Prompt, max_new_tokens: int, manifest: dict[str, Any]
) -> Generation:
    import time

    import torch

    from backends.aoti.lower import load_pt2

    from ..model.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_file)
    eos_ids = set(manifest["tokenizer"]["eos_ids"])
    ids: list[int] = tok.encode(prompt.text, add_special_tokens=prompt.add_special_tokens).ids
    budget = min(max_new_tokens, manifest["runtime"]["max_seq_len"] - len(ids))
    if budget < 1:
        raise ArtifactError(model_file, f"prompt of {len(ids)} tokens leaves no room in the context")
    step = load_pt2(model_file)
    start = time.perf_counter()
    logits = step(torch.tensor([ids]), torch.tensor([0]))
    prefill_s = time.perf_counter() - start
    out = [int(logits[0].argmax())]
    start = time.perf_counter()
    while len(out) < budget and out[-1] not in eos_ids:
        logits = step(torch.tensor([[out[-1]]]), torch.tensor([len(ids) + len(out) - 1]))
        out.append(int(logits[0].argmax()))
    decode_s = time.perf_counter() - start
    shown = out[:-1] if out[-1] in eos_ids else out
    return Generation(
        text=str(tok.decode(shown)),
        prefill_tokens=len(ids),
        prefill_tokens_per_s=len(ids) / prefill_s,
        decode_tokens=len(out),
        # like TextLLMRunner's figure: tokens generated over the time after prefill
        decode_tokens_per_s=(len(out) - 1) / decode_s if decode_s > 0 else float("nan"),
        stopped_at_eos=out[-1] in eos_ids,
    )


def _run_text_llm_runner(
    model_file: Path, tokenizer: Path, prompt: Prompt, max_new_tokens: int, manifest: dict[str, Any]
) -> Generation:
    """ExecuTorch's runner tokenizes the text itself (special tokens in the text are matched as
    such) and adds ``num_bos`` BOS tokens; it stops at the program's ``get_eos_ids``."""
    from backends.xnnpack.runtime import load_executorch_kernels

    from ..plumbing.native_logs import native_logs_captured

    with native_logs_captured():  # the runner's tokenizer library logs at import
        from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
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
        num_bos=1 if prompt.add_special_tokens and manifest["tokenizer"]["add_bos"] else 0,
    )
    pieces: list[str] = []
    stats: list[dict[str, Any]] = []

    def on_stats(s: Any) -> None:
        stats.append(json.loads(s.to_json_string()))

    with native_logs_captured():
        try:
            runner.generate(prompt.text, config, token_callback=pieces.append, stats_callback=on_stats)
        except UnicodeDecodeError:
            # The binding hands each piece over as str; a byte-level piece that is not valid UTF-8
            # on its own cannot cross. Generate again without the callback to still get figures.
            pieces.append("\ufffd")
            runner.reset()
            stats.clear()
            runner.generate(prompt.text, config, stats_callback=on_stats)
    s = stats[-1]
    # The runner hands the EOS token's piece over like any other before it stops.
    stopped = bool(pieces) and pieces[-1] in _eos_texts(tokenizer, manifest["tokenizer"]["eos_ids"])
    return Generation(
        text="".join(pieces[:-1] if stopped else pieces),
        prefill_tokens=int(s["prompt_tokens"]),
        prefill_tokens_per_s=float(s["prefill_token_per_sec"]),
        decode_tokens=int(s["generated_tokens"]),
        decode_tokens_per_s=float(s["decode_token_per_sec"]),
        stopped_at_eos=stopped,
    )


def _eos_texts(tokenizer: Path, eos_ids: list[int]) -> set[str]:
    from ..model.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    return {tok.decode([i], skip_special_tokens=False) for i in eos_ids}
