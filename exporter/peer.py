"""The peer race (``make bench-peer``): ExecuTorch's own LLM export flow (``export_llm``, shipped in the
executorch wheel) against ours, on the same checkpoint with equivalent settings (8-bit dynamic
activations, int4 group-32 weights, XNNPACK, KV cache, custom SDPA, max_seq_len 512).

Reports export wall time and peak RSS (``/usr/bin/time -v``), ``.pte`` size, prefill and decode
tokens/s through ``TextLLMRunner`` and teacher-forced perplexity, with ratios ours / peer.
``--shape`` makes a random-weight Hugging Face checkpoint of a larger published shape first.
Dev tool: needs the ``dev`` extra (transformers) for ``--shape``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_model, open_checkpoint
from .gate_inputs import HELDOUT
from .pipeline import DEFAULT_CHECKPOINT

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "rope_theta": 100000.0,
    },
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
}


def make_shape(name: str, folder: Path) -> Path:
    """Random-weight (seeded) bf16 checkpoint of a published shape, written by transformers."""
    if (folder / "config.json").is_file():
        return folder
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[name], max_position_embeddings=2048, bos_token_id=0, eos_token_id=1)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]
    model.save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json", HELDOUT):
        (folder / f).write_bytes((DEFAULT_CHECKPOINT / f).read_bytes())
    return folder


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Hugging Face's rotate-half q/k rows -> Meta's interleaved RoPE layout (inverse of HF's
    conversion permute)."""
    out_dim, in_dim = w.shape
    return w.view(n_heads, 2, out_dim // n_heads // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def write_meta_checkpoint(checkpoint: Path, out: Path) -> tuple[Path, Path]:
    """The peer reads Meta-format checkpoints: our parameter names are Meta's already."""
    ckpt = open_checkpoint(checkpoint)
    a = ckpt.args
    model = load_model(ckpt, 8)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for i in range(a.n_layers):
        state[f"layers.{i}.attention.wq.weight"] = _unpermute(
            state[f"layers.{i}.attention.wq.weight"], a.n_heads
        )
        state[f"layers.{i}.attention.wk.weight"] = _unpermute(
            state[f"layers.{i}.attention.wk.weight"], a.n_kv_heads
        )
    out.mkdir(parents=True, exist_ok=True)
    pth, params = out / "consolidated.pth", out / "params.json"
    torch.save(state, pth)
    params.write_text(
        json.dumps(
            {
                "dim": a.dim,
                "n_layers": a.n_layers,
                "n_heads": a.n_heads,
                "n_kv_heads": a.n_kv_heads,
                "vocab_size": a.vocab_size,
                "hidden_dim": a.hidden_dim,
                "norm_eps": a.norm_eps,
                "rope_theta": a.rope_theta,
                "use_scaled_rope": a.rope_scaling is not None,
            }
        )
    )
    return pth, params


def run_timed(cmd: list[str], cwd: Path | None = None) -> dict[str, Any]:
    """Wall time and peak RSS of a command, from GNU time (its own RSS is a few MB)."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - start
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"wall_s": wall, "peak_rss_mb": int(m.group(1)) / 1024, "stdout": proc.stdout}


def peer_export(pth: Path, params: Path, out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "executorch.extension.llm.export.export_llm",
        f"base.checkpoint={pth}",
        f"base.params={params}",
        f"base.metadata='{json.dumps(meta)}'",
        "model.use_kv_cache=True",
        "model.use_sdpa_with_kv_cache=True",
        "model.enable_dynamic_shape=True",
        "backend.xnnpack.enabled=True",
        "quantization.qmode=8da4w",
        "quantization.group_size=32",
        "export.max_seq_length=512",
        "export.max_context_length=512",
        f"export.output_dir={out}",
        f"export.output_name={out / 'model.pte'}",
    ]
    done = out / "export.json"
    if done.is_file() and (out / "model.pte").is_file():
        # The peer's figures do not depend on our code: a finished peer export in the same work
        # folder is reused (delete the folder to measure it again).
        return {**json.loads(done.read_text()), "pte": out / "model.pte", "reused": True}
    out.mkdir(parents=True, exist_ok=True)
    result = run_timed(cmd, cwd=out)  # hydra writes its outputs/ folder into the working directory
    if not (out / "model.pte").is_file():
        raise RuntimeError(f"export_llm finished but wrote no {out / 'model.pte'}")
    result.pop("stdout")
    done.write_text(json.dumps(result))
    return {**result, "pte": out / "model.pte"}


# Random weights have near-uniform next-token distributions, so quality against fp32 means nothing
# for them; the gate still runs (its cost is part of ours) and still holds the artifact to the
# eager model it came from (greedy tokens, logit error, KL), only the fp32-quality bounds are off.
RANDOM_WEIGHT_GATE = (
    "validation.min_top1_agreement=1e-9",
    "validation.max_perplexity_ratio=1e9",
    "validation.eval_tokens=64",
)


def our_export(checkpoint: Path, out: Path, random_weights: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "exporter", "--quiet", "build", "android-arm64"]
    cmd += ["--checkpoint", str(checkpoint), "--out", str(out)]
    for item in RANDOM_WEIGHT_GATE if random_weights else ():
        cmd += ["--set", item]
    result = run_timed(cmd)
    folder = Path(result["stdout"].strip().splitlines()[-1])
    stages = json.loads((folder / "manifest.json").read_text())["timings"]
    return {**result, "pte": folder / "model.pte", "stages": stages}


def runner_speeds(
    ptes: dict[str, Path], tokenizer: Path, prompt: str, repeats: int
) -> dict[str, dict[str, float]]:
    """Prefill and decode tokens/s of each program through ``TextLLMRunner``: one warm-up round
    each, then ``repeats`` rounds in which they take turns, the order flipped every round (ours,
    peer, peer, ours, ...), so that a drift of the machine's speed falls on both alike; medians.
    Both programs are loaded for the whole measurement."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from .runtime import load_executorch_kernels, native_logs_captured

    load_executorch_kernels()
    stats: dict[str, list[dict[str, Any]]] = {name: [] for name in ptes}
    with native_logs_captured():
        runners = {name: TextLLMRunner(str(pte), str(tokenizer)) for name, pte in ptes.items()}
        order = list(runners.items())
        for round_ in range(repeats + 1):
            for name, runner in order if round_ % 2 else order[::-1]:
                runner.reset()
                config = GenerationConfig(max_new_tokens=64, temperature=0.0, echo=False, num_bos=1)
                got: list[dict[str, Any]] = []
                runner.generate(
                    prompt,
                    config,
                    stats_callback=lambda s, got=got: got.append(json.loads(s.to_json_string())),
                )
                if round_:  # the first round warms up
                    stats[name] += got
    return {
        name: {
            "prefill_tokens_per_s": statistics.median(s["prefill_token_per_sec"] for s in runs),
            "decode_tokens_per_s": statistics.median(s["decode_token_per_sec"] for s in runs),
            "prompt_tokens": runs[0]["prompt_tokens"],
        }
        for name, runs in stats.items()
    }


def perplexity(pte: Path, ids: list[int]) -> float:
    import math

    import torch.nn.functional as F

    from .runtime import load_pte, native_logs_captured, score

    with native_logs_captured():
        logits = score(load_pte(pte), ids)
    return math.exp(F.cross_entropy(logits, torch.tensor(ids[1:])).item())


def race(
    checkpoint: Path, work: Path, repeats: int, random_weights: bool = False, peer_only: bool = False
) -> dict[str, Any]:
    from .tokenizer import encode, load_tokenizer, tokenizer_info
    from .validate import fp32_reference, perplexity_of

    ckpt = open_checkpoint(checkpoint)
    tok = load_tokenizer(ckpt.tokenizer_path)
    info = tokenizer_info(ckpt.path, ckpt.config, tok)
    ids = encode(tok, info, (DEFAULT_CHECKPOINT / HELDOUT).read_text(encoding="utf-8"))[:256]
    prompt = str(tok.decode(ids[1:129]))
    pth, params = work / "meta" / "consolidated.pth", work / "meta" / "params.json"
    if not (work / "peer" / "export.json").is_file():
        pth, params = write_meta_checkpoint(checkpoint, work / "meta")
    meta = {"get_bos_id": info.bos_id, "get_eos_ids": list(info.eos_ids)}
    peer = peer_export(pth, params, work / "peer", meta)
    if peer_only:
        return {"checkpoint": str(checkpoint), "peer_export": {k: str(v) for k, v in peer.items()}}
    ours = our_export(checkpoint, work / "ours", random_weights)
    fp32_ppl = perplexity_of(fp32_reference(load_model(ckpt, 512), ids))
    rows: dict[str, dict[str, Any]] = {}
    speeds = runner_speeds({"ours": ours["pte"], "peer": peer["pte"]}, ckpt.tokenizer_path, prompt, repeats)
    for name, r in (("ours", ours), ("peer", peer)):
        speed = speeds[name]
        rows[name] = {
            "export_wall_s": r["wall_s"],
            "export_peak_rss_mb": r["peak_rss_mb"],
            "pte_mb": r["pte"].stat().st_size / 1e6,
            **speed,
            "perplexity": perplexity(r["pte"], ids),
        }
    ratios = {k: rows["ours"][k] / rows["peer"][k] for k in rows["ours"] if k != "prompt_tokens"}
    return {
        "checkpoint": str(checkpoint),
        "parameters": ckpt.args.parameter_count(),
        "fp32_perplexity": fp32_ppl,
        "ours": rows["ours"],
        "peer": rows["peer"],
        "ours_over_peer": ratios,
        "our_stages": ours["stages"],
    }


def markdown(results: list[dict[str, Any]]) -> str:
    keys = [
        "export_wall_s",
        "export_peak_rss_mb",
        "pte_mb",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "perplexity",
    ]
    lines = ["| model | params | who | " + " | ".join(keys) + " |", "|---" * (len(keys) + 3) + "|"]
    for r in results:
        name = Path(r["checkpoint"]).name
        for who in ("ours", "peer", "ours_over_peer"):
            cells = " | ".join(f"{r[who][k]:.3g}" for k in keys)
            lines.append(f"| {name} | {r['parameters'] / 1e6:.1f} M | {who} | {cells} |")
        lines.append(f"| {name} | | fp32 eager perplexity | {r['fp32_perplexity']:.4g} |" + " |" * 5)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append", default=[])
    ap.add_argument("--out", type=Path, default=Path("artifacts/bench/peer"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-only", action="store_true", help="run (and keep) the peer exports only")
    ap.add_argument("--skip-default", action="store_true", help="race the --shape models only")
    a = ap.parse_args()
    shapes = [make_shape(s, a.out / "checkpoints" / s) for s in a.shape]
    checkpoints = shapes if a.skip_default else [a.checkpoint, *shapes]
    results = [race(c, a.out / Path(c).name, a.repeats, c != a.checkpoint, a.peer_only) for c in checkpoints]
    if a.peer_only:
        print(json.dumps(results, indent=2))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "peer.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (a.out / "peer.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
