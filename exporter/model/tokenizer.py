"""Tokenizer facts from a checkpoint, as Hugging Face transformers applies them: BOS/EOS ids from its
config files and tokenizer (never from defaults), whether the tokenizer itself puts BOS in front of a
text, the chat template and the special-token strings it reads, and the generation defaults.
Encoding goes through Hugging Face ``tokenizers`` and gives the ids ``AutoTokenizer(folder)(text)``
gives."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ArtifactError, CheckpointError

CHAT_TEMPLATE_FILE = "chat_template.jinja"  # what transformers >= 5 writes beside tokenizer_config.json
# The named special tokens transformers hands a chat template as variables (its special_tokens_map).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# generation_config.json keys a runtime's sampler uses.
GENERATION_KEYS = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
    "max_length",
)


@dataclass(frozen=True)
class TokenizerInfo:
    path: Path  # the tokenizer.json described
    vocab_size: int  # including added tokens
    bos_id: int | None
    eos_ids: tuple[int, ...]  # generation stops at any of them
    # The tokenizer's post-processor puts bos_id in front of every encoded text, as transformers'
    # tokenizer(text) does: an app passes num_bos=1 to ExecuTorch's runner for raw text (never for a
    # rendered chat prompt, whose template writes its own special tokens).
    add_bos: bool
    chat_template: str | None
    special_tokens: dict[str, str]  # e.g. {"bos_token": "<|begin_of_text|>"}: the template's variables
    generation_defaults: dict[str, Any]  # generation_config.json's sampling keys, where present

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.path.name,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_ids": list(self.eos_ids),
            "add_bos": self.add_bos,
            "chat_template": self.chat_template,
            "special_tokens": dict(self.special_tokens),
            "generation_defaults": dict(self.generation_defaults),
        }

    @classmethod
    def from_dict(cls, path: Path, d: dict[str, Any]) -> TokenizerInfo:
        """A manifest's ``tokenizer`` section (``to_dict``) back; ``path`` is the tokenizer.json it names."""

        def get(key: str, kinds: tuple[type, ...], default: Any = ...) -> Any:
            value = d.get(key, default)
            # bool is an int subclass: an id must not be True, a flag must be a real bool
            if value is ... or not isinstance(value, kinds) or isinstance(value, bool) != (bool in kinds):
                raise ArtifactError(
                    path, f"manifest.json's tokenizer.{key} is missing or malformed; rebuild the artifact"
                )
            return value

        eos = get("eos_ids", (list,))
        specials = get("special_tokens", (dict,), {})
        if (
            not eos
            or not all(type(i) is int for i in eos)
            or not all(isinstance(v, str) for v in specials.values())
        ):
            raise ArtifactError(path, "manifest.json's tokenizer section is malformed; rebuild the artifact")
        bos = get("bos_id", (int, type(None)))
        return cls(
            path=path,
            vocab_size=get("vocab_size", (int,)),
            bos_id=bos,
            eos_ids=tuple(eos),
            add_bos=get("add_bos", (bool,)),
            chat_template=get("chat_template", (str, type(None)), None),
            special_tokens=dict(specials),
            generation_defaults=dict(get("generation_defaults", (dict,), {})),
        )


def load_tokenizer(path: Path) -> Any:
    """A ``tokenizers.Tokenizer``, with any truncation or padding baked into the file switched off
    (transformers switches them off too unless a call asks for them)."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for every parse failure
        raise CheckpointError(path, f"not a valid Hugging Face tokenizer.json ({e})") from e
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError as e:  # json's parser recurses
        raise CheckpointError(path, "not valid JSON (nested too deeply)") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, integers past the digit limit
        raise CheckpointError(path, f"not valid JSON ({e})") from e
    return data if isinstance(data, dict) else {}


def _ids(value: Any, source: Path, key: str) -> list[int]:
    """An id or list of ids (config files allow both)."""
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(type(v) is int for v in values):
        raise CheckpointError(source, f"{key} must be an integer or a list of integers, not {value!r}")
    return values


def _token_text(entry: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    text = entry.get("content") if isinstance(entry, dict) else entry
    return text if isinstance(text, str) else None


def special_tokens(folder: Path) -> dict[str, str]:
    """The named special tokens, read as transformers reads them: tokenizer_config.json, overridden
    by a legacy special_tokens_map.json only where tokenizer_config.json has no added_tokens_decoder."""
    config = _json(folder / "tokenizer_config.json")
    entries = {name: config.get(name) for name in SPECIAL_TOKEN_NAMES}
    if "added_tokens_decoder" not in config:
        legacy = _json(folder / "special_tokens_map.json")
        entries.update({name: legacy[name] for name in SPECIAL_TOKEN_NAMES if name in legacy})
    return {name: text for name, entry in entries.items() if (text := _token_text(entry)) is not None}


def chat_template(folder: Path) -> str | None:
    """``chat_template.jinja``, else tokenizer_config.json's ``chat_template``: a string, or a list of
    {"name", "template"} of which the one named "default" (else the first) is used."""
    file = folder / CHAT_TEMPLATE_FILE
    if file.is_file():
        try:
            return file.read_text(encoding="utf-8")  # text mode, like transformers: "\r\n" reads as "\n"
        except UnicodeDecodeError as e:
            raise CheckpointError(file, f"not UTF-8 text ({e})") from e
    config_file = folder / "tokenizer_config.json"
    value = _json(config_file).get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
            for t in value
        )
    ):
        named = {t["name"]: t["template"] for t in value}
        return str(named.get("default", value[0]["template"]))
    raise CheckpointError(
        config_file, 'chat_template must be a string or a list of {"name": ..., "template": ...}'
    )


def _added_around(tokenizer: Any, probe: str, path: Path) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a text's own ids (for one sequence they
    are fixed): found from the empty text, then split around a probe text's ids."""
    both = tokenizer.encode("", add_special_tokens=True).ids
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe, add_special_tokens=True).ids
    for split in range(len(both), -1, -1):  # prefer BOS in front where the split is ambiguous
        if full == [*both[:split], *plain, *both[split:]]:
            return both[:split], both[split:]
    raise CheckpointError(path, "the post-processor changes a text's own ids; only added ids are supported")


def _adds_bos(path: Path, tokenizer: Any, bos: int | None, eos: int) -> bool:
    """Whether the post-processor puts BOS in front of each text, after checking it adds nothing
    else. It alone decides: transformers (5.x) ignores tokenizer_config.json's add_bos_token and
    add_eos_token when there is a tokenizer.json."""
    before, after = _added_around(tokenizer, tokenizer.id_to_token(eos), path)
    if after or before not in ([], [bos]):
        raise CheckpointError(
            path,
            f"the post-processor adds ids {before} before and {after} after each text; only the BOS id "
            f"{bos} in front is supported (it is what a runtime's num_bos adds)",
        )
    return bool(before)


def tokenizer_info(folder: Path, config: dict[str, Any], tokenizer: Any) -> TokenizerInfo:
    path, config_file = folder / "tokenizer.json", folder / "config.json"
    generation_file = folder / "generation_config.json"
    generation = _json(generation_file)
    specials = special_tokens(folder)

    def lookup(name: str) -> int | None:
        text = specials.get(name)
        if text is None:
            return None
        if (tid := tokenizer.token_to_id(text)) is None:
            raise CheckpointError(
                folder / "tokenizer_config.json", f"{name} {text!r} is not a token of tokenizer.json"
            )
        return int(tid)

    bos_ids = _ids(config.get("bos_token_id"), config_file, "bos_token_id") or _ids(
        generation.get("bos_token_id"), generation_file, "bos_token_id"
    )
    bos = bos_ids[0] if bos_ids else lookup("bos_token")
    eos = _ids(config.get("eos_token_id"), config_file, "eos_token_id")
    eos += _ids(generation.get("eos_token_id"), generation_file, "eos_token_id")
    if (tid := lookup("eos_token")) is not None:
        eos.append(tid)
    if not eos:
        raise CheckpointError(
            config_file, "no eos_token_id in config.json, generation_config.json or tokenizer_config.json"
        )
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    for tid in [*eos, *([bos] if bos is not None else [])]:
        if not 0 <= tid < vocab:
            raise CheckpointError(path, f"special token id {tid} outside the vocabulary of {vocab}")
    return TokenizerInfo(
        path=path,
        vocab_size=vocab,
        bos_id=bos,
        eos_ids=tuple(dict.fromkeys(eos)),
        add_bos=_adds_bos(path, tokenizer, bos, eos[0]),
        chat_template=chat_template(folder),
        special_tokens=specials,
        generation_defaults={k: generation[k] for k in GENERATION_KEYS if k in generation},
    )


def encode(tokenizer: Any, info: TokenizerInfo, text: str) -> list[int]:
    """``AutoTokenizer.from_pretrained(folder)(text).input_ids``: the tokenizer's post-processor adds
    the special ids (``tokenizer_info`` has checked it agrees with transformers; ``info.add_bos`` says
    whether BOS is among them)."""
    ids: list[int] = tokenizer.encode(text, add_special_tokens=True).ids
    return ids
