"""The peer race (``make bench-peer``): ExecuTorch's own LLM export flow (``export_llm``, shipped in the
executorch wheel) against ours, on the same checkpoint with the settings of the recipe we race
(``--recipe``, default android-arm64): its linear scheme, group size and scale algorithm, its
embedding quantization and its max sequence length, XNNPACK, KV cache, custom SDPA. What the peer has
no counterpart for (mixed precision, QAT) is part of what ours is raced with.

Both sides are exported afresh in every run, each under ``/usr/bin/time -v``: export wall time and
peak RSS, ``.pte`` size, prefill and decode tokens/s through ``TextLLMRunner``, and for a real
checkpoint the perplexity ratio to the fp32 eager model on the shipped held-out texts "prose" and
"code" and on "other-prose" and "other-code" (sources no calibration text comes from); ratios ours
/ peer. ``--shape`` makes a random-weight Hugging Face checkpoint of a larger
published shape first; for those only time, memory, size and speed are reported (perplexity of random
weights means nothing). Dev tool: needs the ``dev`` extra (transformers) for ``--shape``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from exporter.artifact.manifest import read_build_info
from exporter.build.pipeline import DEFAULT_CHECKPOINT
from exporter.errors import ExporterError
from exporter.gate.inputs import HELDOUT
from exporter.gate.inputs import text_path as gate_text
from exporter.measure.sweep import QUALITY_TEXTS, perplexity_key
from exporter.model.checkpoint import Checkpoint, digest_files, load_model, open_checkpoint
from exporter.model.transformer import ModelArgs, RopeScaling
from exporter.recipe import Recipe, load_recipe

DEFAULT_RECIPE = "android-arm64"
# The sweep's shipped texts, and prose and Python from sources no calibration text comes from
# (what the device recipes' manifests judge): a tuned build is raced on text it was not tuned on.
RACE_TEXTS = (*QUALITY_TEXTS, "other-prose", "other-code")

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


# executorch 1.5.1's Llama-3 frequency scaling (examples/models/llama/rope.py, ``apply_scaling``)
# reads ``rope_scale_factor`` and ``high_freq_factor`` from params.json but hard-codes
# ``low_freq_factor = 1`` and the original context length 8192 (its ModelArgs'
# ``original_max_position_embeddings`` feeds only the Hugging Face / LongRoPE path). A checkpoint
# with other values would give the peer a different model, so it is refused rather than raced.
PEER_FIXED_ROPE = {"low_freq_factor": 1.0, "original_max_position_embeddings": 8192}
# What executorch's Llama ModelArgs can express; any other feature of ours is refused.
PEER_FIELDS = (
    "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "vocab_size", "norm_eps",
    "rope_theta", "rope_scaling", "attention_bias", "qk_norm", "tie_word_embeddings",
    "max_position_embeddings",
)  # fmt: skip


def _number(x: float) -> int | float:
    """executorch types the rope factors ``int``; a whole factor is written as one."""
    return int(x) if float(x).is_integer() else x


def uses_hf_rope(args: ModelArgs) -> bool:
    """Whether the peer takes the checkpoint in Hugging Face's rotate-half layout: as ExecuTorch's
    own Qwen configs do for models with q/k/v bias or q/k norm (the norm weights run along
    ``head_dim``, which Meta's interleaved layout would reorder)."""
    return args.attention_bias or args.qk_norm == "head"


def params_json(args: ModelArgs) -> dict[str, Any]:
    """The Meta ``params.json`` executorch's ModelArgs reads for ``args`` (no ``max_seq_len``: the
    export sets it). Without ``rope_scale_factor`` a scaled checkpoint would get executorch's
    default 8 whatever its own factor (Llama-3.2-1B's is 32). What executorch 1.5.1's Llama model
    can express: Llama, Qwen2 (q/k/v bias), Qwen3 (q/k norm per head, before RoPE). Its ModelArgs
    declares more (``act_fn``, ``embedding_scale_factor``, ``sliding_window``,
    ``attention_multiplier``, ...), but the XNNPACK path's model reads none of them (only the
    Qualcomm static model does), so Gemma 3, Granite, Mistral's windows, OLMo 2, SmolLM3 and Phi-3
    are refused here rather than raced against a different model."""
    params: dict[str, Any] = {
        "dim": args.dim,
        "n_layers": args.n_layers,
        "n_heads": args.n_heads,
        "n_kv_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "hidden_dim": args.hidden_dim,
        "norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "use_scaled_rope": args.rope_scaling is not None,
    }
    if args.qk_norm not in ("", "head"):
        raise ValueError("the peer's Llama model normalises q/k per head only")
    plain = ModelArgs(**{f: getattr(args, f) for f in PEER_FIELDS})
    extra = [f.name for f in fields(ModelArgs) if getattr(args, f.name) != getattr(plain, f.name)]
    if extra:
        raise ValueError(f"the peer's Llama model has no {extra[0]}")
    if args.attention_bias:
        params["attention_qkv_bias"] = True
    if args.qk_norm == "head":
        params |= {"use_qk_norm": True, "qk_norm_before_rope": True}
    if uses_hf_rope(args):
        params["use_hf_rope"] = True
    s = args.rope_scaling
    if s is None:
        return params
    if not isinstance(s, RopeScaling):
        raise ValueError("the peer's Llama model scales RoPE the llama3 way only")
    for key, fixed in PEER_FIXED_ROPE.items():
        if getattr(s, key) != fixed:
            raise ValueError(f"rope_scaling.{key}={getattr(s, key)}: executorch hard-codes {fixed}")
    return params | {
        "rope_scale_factor": _number(s.factor),
        "high_freq_factor": _number(s.high_freq_factor),
    }


# Our parameter names are Meta's but for these (executorch's Qwen3 converter names them so).
PEER_NAMES = {
    ".attention.q_norm.weight": ".attention.q_norm_fn.weight",
    ".attention.k_norm.weight": ".attention.k_norm_fn.weight",
}


def meta_state(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """The checkpoint as the peer's Llama model names and lays it out."""
    a = ckpt.args
    params_json(a)  # refuse what the peer cannot run before reading any weight
    state = {k: v.detach().clone() for k, v in load_model(ckpt, 8).state_dict().items()}
    if not uses_hf_rope(a):  # Meta's interleaved RoPE: q and k rows in its order
        for i in range(a.n_layers):
            for name, heads in (("wq", a.n_heads), ("wk", a.n_kv_heads)):
                key = f"layers.{i}.attention.{name}.weight"
                state[key] = _unpermute(state[key], heads)
    for ours, theirs in PEER_NAMES.items():
        for key in [k for k in state if k.endswith(ours)]:
            state[key.removesuffix(ours) + theirs] = state.pop(key)
    return state


def write_meta_checkpoint(checkpoint: Path, out: Path) -> tuple[Path, Path]:
    """The peer reads Meta-format checkpoints (``meta_state``) with a ``params.json``."""
    ckpt = open_checkpoint(checkpoint)
    state = meta_state(ckpt)
    out.mkdir(parents=True, exist_ok=True)
    pth, params = out / "consolidated.pth", out / "params.json"
    torch.save(state, pth)
    params.write_text(json.dumps(params_json(ckpt.args)))
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


# our export.dtype -> export_llm's model.dtype_override
PEER_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


def peer_settings(recipe: Recipe) -> list[str]:
    """export_llm's model and quantization options equivalent to ``recipe`` (ValueError where it has
    none). Hydra reads a comma as a list separator: the embedding setting is quoted."""
    linear, emb = recipe.quantization.linear, recipe.quantization.embedding
    if recipe.backend != "xnnpack":
        raise ValueError(f"recipe {recipe.name!r}: the peer exports XNNPACK programs only")
    if linear is not None and linear.scheme != "8da4w":
        raise ValueError(f"recipe {recipe.name!r}: the peer has no {linear.scheme} linears (only 8da4w)")
    seq = recipe.export.max_seq_len
    settings = [
        "model.use_kv_cache=True",
        f"model.use_sdpa_with_kv_cache={recipe.export.custom_sdpa}",
        "model.enable_dynamic_shape=True",
        f"model.dtype_override={PEER_DTYPES[recipe.export.dtype]}",
        "backend.xnnpack.enabled=True",
        f"export.max_seq_length={seq}",
        f"export.max_context_length={seq}",
        # One switch for linears and embedding alike (its default is HQQ); our embedding always
        # takes affine scales.
        f"quantization.use_hqq={linear is not None and linear.scale_algorithm == 'hqq_scale_only'}",
    ]
    if linear is not None:
        settings += ["quantization.qmode=8da4w", f"quantization.group_size={linear.group_size}"]
    if emb is not None:
        settings.append(f"quantization.embedding_quantize='{emb.bits},{emb.group_size}'")
    return settings


def peer_label(recipe: Recipe) -> str:
    """What the peer's program holds, in the words of the sweep chart."""
    linear, emb = recipe.quantization.linear, recipe.quantization.embedding
    parts = ["fp32 linears" if linear is None else linear.label()]
    parts.append("fp32 embedding" if emb is None else f"embedding int{emb.bits} g{emb.group_size}")
    return "export_llm " + ", ".join(parts)


def peer_command(pth: Path, params: Path, out: Path, meta: dict[str, Any], recipe: Recipe) -> list[str]:
    # absolute: export_llm runs in ``out`` (hydra writes its outputs/ folder into the working directory)
    pth, params, out = pth.resolve(), params.resolve(), out.resolve()
    return [
        sys.executable,
        "-m",
        "executorch.extension.llm.export.export_llm",
        # llama3 (its default, pinned): for any model class but llama3 and llama3_1 export_llm
        # replaces the params.json rope_scale_factor by 32
        "base.model_class=llama3",
        f"base.checkpoint={pth}",
        f"base.params={params}",
        f"base.metadata='{json.dumps(meta)}'",
        *peer_settings(recipe),
        f"export.output_dir={out}",
        f"export.output_name={out / 'model.pte'}",
    ]


def fresh_folder(folder: Path) -> Path:
    """An empty ``folder``: a program left by an earlier run must never be measured as this one's."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def peer_export(pth: Path, params: Path, out: Path, meta: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    cmd = peer_command(pth, params, fresh_folder(out), meta, recipe)
    result = run_timed(cmd, cwd=out)  # hydra writes its outputs/ folder into the working directory
    if not (out / "model.pte").is_file():
        raise RuntimeError(f"export_llm finished but wrote no {out / 'model.pte'}")
    result.pop("stdout")
    return {**result, "pte": out / "model.pte"}


# Random weights have near-uniform next-token distributions, so quality against fp32 means nothing
# for them; the gate still runs (its cost is part of ours) and still holds the artifact to the
# eager model it came from (greedy tokens, logit error, KL), only the fp32-quality bounds are off.
# Tuning on the model (GPTQ, mixed precision, QAT) has no quality to keep there either: shapes race
# the recipe's untuned, streamed build, the cost the peer's flow is compared with.
RANDOM_WEIGHT_GATE = (
    "validation.min_top1_agreement=1e-9",
    "validation.max_perplexity_ratio=1e9",
    "validation.eval_tokens=64",
)


def random_weight_gate(recipe: str) -> tuple[str, ...]:
    """``RANDOM_WEIGHT_GATE``, and the judged texts' bar off where ``recipe`` sets one (they are
    still scored: their cost is part of the build's)."""
    judged = load_recipe(recipe).validation.judge_max_perplexity_ratio is not None
    return RANDOM_WEIGHT_GATE + (("validation.judge_max_perplexity_ratio=1e9",) if judged else ())


def untuned(recipe: str) -> tuple[str, ...]:
    """The ``--set`` switches that turn off every tuning table ``recipe`` has."""
    quant = load_recipe(recipe).quantization
    return tuple(f"quantization.{k}=false" for k in ("gptq", "mixed", "qat") if getattr(quant, k) is not None)


def our_export(checkpoint: Path, out: Path, recipe: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "exporter", "--quiet", "build", recipe]
    cmd += ["--checkpoint", str(checkpoint), "--out", str(fresh_folder(out))]
    for item in overrides:
        cmd += ["--set", item]
    result = run_timed(cmd)
    folder = Path(result["stdout"].strip().splitlines()[-1])
    stages = read_build_info(folder)["timings"]
    return {**result, "pte": folder / "model.pte", "stages": stages}


def runner_speeds(
    ptes: dict[str, Path], tokenizer: Path, prompt: str, repeats: int
) -> dict[str, dict[str, float]]:
    """Prefill and decode tokens/s of each program through ``TextLLMRunner``: one warm-up round
    each, then ``repeats`` rounds in which they take turns, the order flipped every round (ours,
    peer, peer, ours, ...), so that a drift of the machine's speed falls on both alike; medians.
    Both programs are loaded for the whole measurement."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from backends.xnnpack.runtime import load_executorch_kernels
    from exporter.plumbing.native_logs import native_logs_captured

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
    import torch.nn.functional as F

    from backends.xnnpack.runtime import load_pte
    from exporter.gate.steppers import score
    from exporter.plumbing.native_logs import native_logs_captured

    with native_logs_captured():
        logits = score(load_pte(pte), ids)
    return math.exp(F.cross_entropy(logits, torch.tensor(ids[1:])).item())


def text_ids(text: str, ckpt: Checkpoint, tok: Any, max_seq_len: int) -> list[int]:
    """A shipped text's tokens as ``exporter eval`` scores them by default: the whole cache."""
    from exporter.model.tokenizer import encode, tokenizer_info

    path, _ = gate_text(text, ckpt.path)
    return encode(tok, tokenizer_info(ckpt.path, ckpt.config, tok), path.read_text(encoding="utf-8"))[
        :max_seq_len
    ]


def quality(
    ckpt: Checkpoint, tok: Any, ptes: dict[str, Path], max_seq_len: int
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """fp32 eager perplexity per text, and each program's perplexity ratio to it per text."""
    from exporter.gate.validate import fp32_reference, perplexity_of

    model = load_model(ckpt, max_seq_len)
    fp32: dict[str, float] = {}
    ratios: dict[str, dict[str, float]] = {name: {} for name in ptes}
    for text in RACE_TEXTS:
        ids = text_ids(text, ckpt, tok, max_seq_len)
        fp32[text] = perplexity_of(fp32_reference(model, ids))
        for name, pte in ptes.items():
            ratios[name][perplexity_key(text)] = perplexity(pte, ids) / fp32[text]
    return fp32, ratios


def race(
    checkpoint: Path,
    work: Path,
    recipe_name: str,
    repeats: int,
    random_weights: bool = False,
    peer_only: bool = False,
) -> dict[str, Any]:
    from exporter.model.tokenizer import encode, load_tokenizer, tokenizer_info

    overrides = random_weight_gate(recipe_name) + untuned(recipe_name) if random_weights else ()
    recipe = load_recipe(recipe_name, overrides)  # the very settings our build resolves
    ckpt = open_checkpoint(checkpoint)
    tok = load_tokenizer(ckpt.tokenizer_path)
    info = tokenizer_info(ckpt.path, ckpt.config, tok)
    ids = encode(tok, info, (DEFAULT_CHECKPOINT / HELDOUT).read_text(encoding="utf-8"))[:256]
    prompt = str(tok.decode(ids[1:129]))
    pth, params = write_meta_checkpoint(checkpoint, work / "meta")
    meta = {"get_bos_id": info.bos_id, "get_eos_ids": list(info.eos_ids)}
    peer = peer_export(pth, params, work / "peer", meta, recipe)
    described = {
        "checkpoint": str(checkpoint),
        # as the manifest's model.checkpoint_sha256, so `exporter sweep` finds the race of its artifacts
        "checkpoint_sha256": digest_files(
            [ckpt.path / "config.json", *ckpt.weight_files, ckpt.tokenizer_path]
        ),
        "recipe": recipe.name,
        "random_weights": random_weights,
        "peer_label": peer_label(recipe),
        "peer_settings": peer_settings(recipe),
    }
    if peer_only:
        return {**described, "peer_export": {k: str(v) for k, v in peer.items()}}
    ours = our_export(checkpoint, work / "ours", recipe_name, overrides)
    rows: dict[str, dict[str, Any]] = {}
    speeds = runner_speeds({"ours": ours["pte"], "peer": peer["pte"]}, ckpt.tokenizer_path, prompt, repeats)
    for name, r in (("ours", ours), ("peer", peer)):
        rows[name] = {
            "export_wall_s": r["wall_s"],
            "export_peak_rss_mb": r["peak_rss_mb"],
            "pte_mb": r["pte"].stat().st_size / 1e6,
            **speeds[name],
        }
    fp32: dict[str, float] = {}
    if not random_weights:
        fp32, ratios = quality(
            ckpt, tok, {"ours": ours["pte"], "peer": peer["pte"]}, recipe.export.max_seq_len
        )
        for name in rows:
            rows[name] |= ratios[name]
    return {
        **described,
        "parameters": ckpt.args.parameter_count(),
        **({"fp32_perplexity": fp32} if fp32 else {}),
        "ours": rows["ours"],
        "peer": rows["peer"],
        "ours_over_peer": {
            k: rows["ours"][k] / rows["peer"][k] for k in rows["ours"] if k != "prompt_tokens"
        },
        "our_stages": ours["stages"],
    }


MARKDOWN_KEYS = (
    "export_wall_s",
    "export_peak_rss_mb",
    "pte_mb",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    *(perplexity_key(t) for t in RACE_TEXTS),
)


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def markdown(results: list[dict[str, Any]]) -> str:
    keys = MARKDOWN_KEYS
    lines = ["| model | params | who | " + " | ".join(keys) + " |", "|---" * (len(keys) + 3) + "|"]
    notes: list[str] = []
    for r in results:
        name = Path(r["checkpoint"]).name
        for who in ("ours", "peer", "ours_over_peer"):
            cells = " | ".join(_cell(r[who].get(k)) for k in keys)
            lines.append(f"| {name} | {r['parameters'] / 1e6:.1f} M | {who} | {cells} |")
        fp32 = r.get("fp32_perplexity")
        if fp32:
            notes.append(
                f"{name}: fp32 eager perplexity " + ", ".join(f"{t} {p:.4g}" for t, p in fp32.items())
            )
        else:
            notes.append(f"{name}: random weights, perplexity not reported")
    return "\n".join([*lines, "", *(f"- {n}" for n in notes)]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    ap.add_argument("--recipe", default=DEFAULT_RECIPE, help="recipe we race (its settings go to the peer)")
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append", default=[])
    ap.add_argument("--out", type=Path, default=Path("artifacts/bench/peer"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-only", action="store_true", help="run the peer exports only")
    ap.add_argument("--skip-default", action="store_true", help="race the --shape models only")
    a = ap.parse_args()
    try:
        peer_settings(load_recipe(a.recipe))  # refuse a recipe the peer cannot match before any work
    except (ValueError, ExporterError) as e:
        ap.error(str(e))
    shapes = [make_shape(s, a.out / "checkpoints" / s) for s in a.shape]
    checkpoints = shapes if a.skip_default else [a.checkpoint, *shapes]
    results = [
        race(c, a.out / Path(c).name, a.recipe, a.repeats, c != a.checkpoint, a.peer_only)
        for c in checkpoints
    ]
    if a.peer_only:
        print(json.dumps(results, indent=2))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "peer.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (a.out / "peer.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
