"""What the validation gate feeds the artifact, resolved and checked before any weight is read:
the held-out text, the raw and chat-formatted prompts, and their lengths against the cache."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RecipeError
from ..model.tokenizer import TokenizerInfo, encode
from ..recipe import Recipe

DATA = Path(__file__).resolve().parents[1] / "data"
TEXTS = DATA / "texts"
DEFAULT_TEXT = "prose-and-code"
HELDOUT = "heldout.txt"


@dataclass(frozen=True)
class GateInputs:
    ids: list[int]  # held-out text, eval_tokens + 1 tokens
    text: dict[str, Any]  # what the manifest says of the text: source, sha256, tokens
    prompts: list[list[int]]  # raw prompts, then chat-formatted ones
    chat_prompts: list[str]  # the rendered chat prompts (empty without a chat template)
    judged: dict[str, list[int]]  # validation.judge_texts by manifest name, judge_tokens + 1 tokens


def text_path(setting: str, checkpoint_dir: Path) -> tuple[Path, str]:
    """``validation.text`` -> (file, the name the manifest gives it).

    "" means the checkpoint's own ``heldout.txt`` if it ships one, else the shipped prose-and-code
    text; a bare name is a shipped text (``exporter/data/texts/NAME.txt``); anything else a path."""
    if not setting:
        own = checkpoint_dir / HELDOUT
        if own.is_file():
            return own, f"checkpoint:{HELDOUT}"
        setting = DEFAULT_TEXT
    shipped = TEXTS / f"{setting}.txt"
    if "/" not in setting and shipped.is_file():
        return shipped, f"shipped:{setting}"
    return Path(setting), f"file:{Path(setting).name}"


def _read(path: Path, recipe_file: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        known = ", ".join(sorted(p.stem for p in TEXTS.glob("*.txt")))
        raise RecipeError(
            recipe_file, f"validation.text: cannot read {path} ({e}; shipped texts: {known})"
        ) from e


def first_tokens(
    ids: list[int], count: int, recipe_file: Path, key: str, source: object, needed_by: str
) -> list[int]:
    """The first ``count`` ids of a text; a text shorter than that is a one-line recipe error
    naming the key that lists the text and the key that asks for the tokens."""
    if len(ids) < count:
        raise RecipeError(recipe_file, f"{key}: {source} has {len(ids)} tokens, {needed_by} needs {count}")
    return ids[:count]


def chat_prompt_texts(recipe: Recipe, info: TokenizerInfo) -> list[str]:
    """The recipe's chat messages rendered with the checkpoint's template, as transformers would."""
    if info.chat_template is None or not recipe.validation.chat_prompts:
        return []
    from ..model.chat import chat_messages, render_chat

    return [
        render_chat(info.chat_template, chat_messages(m, None), info.special_tokens, source=info.path)
        for m in recipe.validation.chat_prompts
    ]


def gate_inputs(
    recipe: Recipe, recipe_file: Path, tokenizer: Any, info: TokenizerInfo, ckpt_dir: Path
) -> GateInputs:
    """Every length the gate needs, checked against the cache: one-line errors naming the key."""
    v, max_seq = recipe.validation, recipe.export.max_seq_len
    if v.eval_tokens + 1 > max_seq:
        raise RecipeError(
            recipe_file,
            f"validation.eval_tokens: {v.eval_tokens} + 1 exceeds export.max_seq_len {max_seq} "
            "(the held-out text is scored in one pass through the cache)",
        )
    path, name = text_path(v.text, ckpt_dir)
    text = _read(path, recipe_file)
    ids = first_tokens(
        encode(tokenizer, info, text),
        v.eval_tokens + 1,
        recipe_file,
        "validation.text",
        path,
        "validation.eval_tokens",
    )
    rendered = chat_prompt_texts(recipe, info)
    raw = [(f"validation.prompts[{i}]", encode(tokenizer, info, p)) for i, p in enumerate(v.prompts)]
    chat = []
    if rendered:
        from ..model.chat import encode_chat

        chat = [(f"validation.chat_prompts[{i}]", encode_chat(tokenizer, t)) for i, t in enumerate(rendered)]
    for key, prompt in sorted(raw + chat, key=lambda kp: -len(kp[1])):  # the longest one is named
        if len(prompt) + v.greedy_steps > max_seq:
            raise RecipeError(
                recipe_file,
                f"{key}: {len(prompt)} prompt tokens + validation.greedy_steps {v.greedy_steps} "
                f"exceed export.max_seq_len {max_seq}",
            )
        if not prompt:
            raise RecipeError(recipe_file, f"{key}: encodes to no tokens")
    described = {
        "source": name,
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "tokens_scored": v.eval_tokens,
    }
    judged = {}
    for i, setting in enumerate(v.judge_texts):
        judge_path, judge_name = text_path(setting, ckpt_dir)
        judge_ids = encode(tokenizer, info, _read(judge_path, recipe_file))
        judged[judge_name] = first_tokens(
            judge_ids,
            v.judge_tokens + 1,
            recipe_file,
            f"validation.judge_texts[{i}]",
            judge_path,
            "validation.judge_tokens",
        )
    return GateInputs(ids, described, [p for _, p in raw + chat], rendered, judged)
