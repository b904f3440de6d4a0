"""Tokenizer facts from a checkpoint: BOS/EOS ids come from its config files and tokenizer, never from
defaults. Encoding and decoding go through Hugging Face ``tokenizers``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CheckpointError


@dataclass(frozen=True)
class TokenizerInfo:
    path: Path
    vocab_size: int
    bos_id: int | None
    eos_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.path.name,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_ids": list(self.eos_ids),
            "add_bos": self.add_bos,
            "chat_template": self.chat_template,
        }


def load_tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for every parse failure
        raise CheckpointError(path, f"not a valid Hugging Face tokenizer.json ({e})") from e


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not valid JSON ({e})") from e
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else [int(v) for v in value]


def tokenizer_info(folder: Path, config: dict[str, Any], tokenizer: Any) -> TokenizerInfo:
    path = folder / "tokenizer.json"
    generation = _json(folder / "generation_config.json")
    tok_config = _json(folder / "tokenizer_config.json")

    def token_id(entry: Any) -> int | None:
        text = entry.get("content") if isinstance(entry, dict) else entry
        return None if text is None else tokenizer.token_to_id(text)

    bos_ids = _ids(config.get("bos_token_id", generation.get("bos_token_id")))
    bos = bos_ids[0] if bos_ids else token_id(tok_config.get("bos_token"))
    eos = _ids(config.get("eos_token_id")) + _ids(generation.get("eos_token_id"))
    if not eos and (t := token_id(tok_config.get("eos_token"))) is not None:
        eos = [t]
    if not eos:
        raise CheckpointError(
            folder / "config.json",
            "no eos_token_id in config.json, generation_config.json or tokenizer_config.json",
        )
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    for tid in [*eos, *([bos] if bos is not None else [])]:
        if not 0 <= tid < vocab:
            raise CheckpointError(path, f"special token id {tid} outside the vocabulary of {vocab}")
    template = tok_config.get("chat_template")
    return TokenizerInfo(
        path=path,
        vocab_size=vocab,
        bos_id=bos,
        eos_ids=tuple(dict.fromkeys(eos)),
        # Llama-style tokenizers start every sequence with BOS; Qwen's declare no bos_token.
        add_bos=bos is not None
        and bool(tok_config.get("add_bos_token", tok_config.get("bos_token") is not None)),
        chat_template=template if isinstance(template, str) else None,
    )


def encode(tokenizer: Any, info: TokenizerInfo, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    return [info.bos_id, *ids] if info.add_bos and info.bos_id is not None else ids
