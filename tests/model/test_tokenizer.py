"""Tokenizer facts and ids: parity with transformers' AutoTokenizer on small tokenizers that
transformers itself saves, in the styles of Llama 3, Qwen2.5 and SmolLM2, and on the shipped one."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import exporter
from exporter.errors import ArtifactError, CheckpointError
from exporter.model.tokenizer import TokenizerInfo, encode, load_tokenizer, tokenizer_info

SHIPPED = Path(exporter.__file__).parent / "data" / "pycode-4m"
CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "def add(x, y):\n    return x + y\n",
    "héllo wörld, ünïcode: 你好 🙂",
]
TEXTS = [
    "hi",
    "Hello world, this is a tiny corpus.",
    "héllo wörld 你好 🙂 — «ok»",
    "  two leading spaces\n\ttab and trailing  ",
    "special <|im_end|> and <|eot_id|> in the text",
    "",
]

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- if strftime_now is defined %}
    {%- set date_string = strftime_now("%Y") %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
        + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
QWEN_TEMPLATE = """{%- if tools is not none %}
    {{- raise_exception('this test template has no tool support') }}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. '
        + 'You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
        or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Gemma 3's (instruction-tuned releases; the 270M base model ships none): no system role (its text is
# prefixed to the first user turn), "model" for the assistant, contents trimmed.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""
# Phi-3 / Phi-3.5-mini's.
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)


@dataclass(frozen=True)
class Style:
    """A checkpoint's tokenizer files; token strings in ``config``/``generation`` become their ids."""

    specials: list[str]  # added first, so ids 0, 1, ...
    prepend: str | None  # what the post-processor puts in front of every text
    named: dict[str, str]  # bos_token, eos_token, ... as PreTrainedTokenizerFast takes them
    config: dict[str, Any]
    generation: dict[str, Any]
    template: str
    extra_processor: bool = False  # a ByteLevel post-processor (Qwen's), which adds no ids
    expected: dict[str, Any] = field(default_factory=dict)


STYLES = {
    "llama3": Style(
        specials=[
            *("<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
            *("<|start_header_id|>", "<|end_header_id|>"),
        ],
        prepend="<|begin_of_text|>",
        named={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        config={"bos_token_id": "<|begin_of_text|>", "eos_token_id": "<|end_of_text|>"},
        generation={
            "bos_token_id": "<|begin_of_text|>",
            "eos_token_id": ["<|eom_id|>", "<|end_of_text|>"],
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.9,
        },
        template=LLAMA3_TEMPLATE,
        # the union in order: config.json, generation_config.json, then tokenizer_config's eos_token
        expected={"bos_id": 0, "eos_ids": (1, 2, 3), "add_bos": True},
    ),
    "qwen2.5": Style(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        prepend=None,
        named={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        config={"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>"},
        generation={
            "bos_token_id": "<|endoftext|>",
            "eos_token_id": ["<|im_end|>", "<|endoftext|>"],
            "do_sample": True,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "repetition_penalty": 1.05,
            "pad_token_id": "<|endoftext|>",
        },
        template=QWEN_TEMPLATE,
        extra_processor=True,
        expected={"bos_id": 0, "eos_ids": (2, 0), "add_bos": False},
    ),
    "smollm2": Style(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        prepend=None,
        named={
            "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>",
            "unk_token": "<|endoftext|>",
            "pad_token": "<|im_end|>",
        },
        config={"bos_token_id": "<|im_start|>", "eos_token_id": "<|im_end|>"},
        generation={"bos_token_id": "<|im_start|>", "eos_token_id": "<|im_end|>"},
        template=SMOLLM2_TEMPLATE,
        expected={"bos_id": 1, "eos_ids": (2,), "add_bos": False},
    ),
    "gemma3": Style(
        specials=["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
        prepend="<bos>",
        named={"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
        config={"bos_token_id": "<bos>", "eos_token_id": "<eos>"},
        generation={"bos_token_id": "<bos>", "eos_token_id": ["<eos>", "<end_of_turn>"], "top_k": 64},
        template=GEMMA3_TEMPLATE,
        expected={"bos_id": 2, "eos_ids": (1, 4), "add_bos": True},
    ),
    "phi3": Style(
        specials=["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        prepend="<s>",
        named={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        config={"bos_token_id": "<s>", "eos_token_id": "</s>"},
        generation={"bos_token_id": "<s>", "eos_token_id": ["</s>", "<|end|>"]},
        template=PHI3_TEMPLATE,
        expected={"bos_id": 1, "eos_ids": (2, 6), "add_bos": True},
    ),
}


def train_tokenizer(specials: list[str]) -> Any:
    """A byte-level BPE over a tiny corpus (any text encodes), special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 3, trainer)
    return tok


def write_style(folder: Path, style: Style) -> Path:
    """``save_pretrained`` of the style's tokenizer, plus config.json and generation_config.json."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = train_tokenizer(style.specials)
    if style.prepend is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{style.prepend} $A",
            pair=f"{style.prepend} $A {style.prepend} $B",
            special_tokens=[(style.prepend, tok.token_to_id(style.prepend))],
        )
    elif style.extra_processor:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1")
    PreTrainedTokenizerFast(
        tokenizer_object=tok, chat_template=style.template, **style.named
    ).save_pretrained(folder)

    def ids(value: Any) -> Any:
        if isinstance(value, list):
            return [ids(v) for v in value]
        return tok.token_to_id(value) if isinstance(value, str) and value in style.specials else value

    config = {"model_type": "llama", **{k: ids(v) for k, v in style.config.items()}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(
        json.dumps({k: ids(v) for k, v in style.generation.items()})
    )
    return folder


@pytest.fixture(scope="session")
def styled(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            made[name] = write_style(tmp_path_factory.mktemp("tok") / name, STYLES[name])
        return made[name]

    return make


@pytest.fixture
def copy_of(styled: Callable[[str], Path], tmp_path: Path) -> Callable[[str], Path]:
    """A private copy of a styled folder that a test may change."""
    return lambda name: Path(shutil.copytree(styled(name), tmp_path / name))


def info_of(folder: Path) -> tuple[Any, TokenizerInfo]:
    config = json.loads((folder / "config.json").read_text())
    tok = load_tokenizer(folder / "tokenizer.json")
    return tok, tokenizer_info(folder, config, tok)


def hf_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def rewrite_json(path: Path, **changes: Any) -> None:
    data = read_json(path) if path.is_file() else {}
    data.update(changes)
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))


@pytest.mark.parametrize("name", sorted(STYLES))
def test_ids_match_transformers(styled: Callable[[str], Path], name: str) -> None:
    folder = styled(name)
    tok, info = info_of(folder)
    hf = hf_tokenizer(folder)
    for text in TEXTS:
        assert encode(tok, info, text) == hf(text).input_ids, text


@pytest.mark.parametrize("name", sorted(STYLES))
def test_facts(styled: Callable[[str], Path], name: str) -> None:
    folder = styled(name)
    style = STYLES[name]
    _, info = info_of(folder)
    hf = hf_tokenizer(folder)
    assert (info.bos_id, info.eos_ids, info.add_bos) == tuple(
        style.expected[k] for k in ("bos_id", "eos_ids", "add_bos")
    )
    assert info.chat_template == style.template == hf.chat_template
    assert info.special_tokens == hf.special_tokens_map == style.named
    expected_defaults = {k: v for k, v in style.generation.items() if not k.endswith("token_id")}
    assert info.generation_defaults == expected_defaults
    assert info.vocab_size == len(hf)


def test_smollm2_declares_bos_but_adds_none(styled: Callable[[str], Path]) -> None:
    folder = styled("smollm2")
    tok, info = info_of(folder)
    assert encode(tok, info, "hi") == hf_tokenizer(folder)("hi").input_ids
    assert info.special_tokens["bos_token"] == "<|im_start|>" and info.bos_id == 1 and not info.add_bos


def test_shipped_tokenizer_matches_transformers() -> None:
    tok, info = info_of(SHIPPED)
    hf = hf_tokenizer(SHIPPED)
    heldout = (SHIPPED / "heldout.txt").read_text(encoding="utf-8")[:2000]
    for text in [*TEXTS, heldout]:
        assert encode(tok, info, text) == hf(text).input_ids
    assert (info.bos_id, info.eos_ids, info.add_bos, info.chat_template) == (0, (1,), True, None)
    assert encode(tok, info, "x")[0] == 0


def test_eos_union_dedups_in_order(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("llama3")
    rewrite_json(folder / "config.json", eos_token_id=[3, 1])
    rewrite_json(folder / "generation_config.json", eos_token_id=2)
    rewrite_json(folder / "tokenizer_config.json", eos_token={"content": "<|end_of_text|>", "special": True})
    assert info_of(folder)[1].eos_ids == (3, 1, 2)


def test_eos_from_tokenizer_config_alone(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("smollm2")
    rewrite_json(folder / "config.json", eos_token_id=None)
    (folder / "generation_config.json").unlink()
    assert info_of(folder)[1].eos_ids == (2,)


def test_no_eos_anywhere(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("qwen2.5")
    rewrite_json(folder / "config.json", eos_token_id=None)
    rewrite_json(folder / "generation_config.json", eos_token_id=None)
    rewrite_json(folder / "tokenizer_config.json", eos_token=None)
    with pytest.raises(CheckpointError, match="no eos_token_id") as e:
        info_of(folder)
    assert e.value.path == folder / "config.json"


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        ("config.json", {"eos_token_id": 9999}, "outside the vocabulary"),
        ("config.json", {"eos_token_id": "2"}, "eos_token_id must be an integer"),
        ("tokenizer_config.json", {"eos_token": "<|nope|>"}, "not a token of tokenizer.json"),
    ],
)
def test_bad_eos(copy_of: Callable[[str], Path], file: str, change: dict[str, Any], message: str) -> None:
    folder = copy_of("smollm2")
    rewrite_json(folder / file, **change)
    with pytest.raises(CheckpointError, match=message):
        info_of(folder)


@pytest.mark.parametrize(
    "file", ["tokenizer_config.json", "generation_config.json", "special_tokens_map.json"]
)
def test_bad_json_is_one_line_naming_the_file(copy_of: Callable[[str], Path], file: str) -> None:
    folder = copy_of("llama3")
    (folder / file).write_text('{"eos_token": "<|eot_id|>",\n')
    with pytest.raises(CheckpointError, match="not valid JSON") as e:
        info_of(folder)
    assert e.value.path == folder / file and "\n" not in str(e.value)


def test_chat_template_file_wins_over_tokenizer_config(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("smollm2")
    rewrite_json(folder / "tokenizer_config.json", chat_template="{{ 'from tokenizer_config' }}")
    assert info_of(folder)[1].chat_template == SMOLLM2_TEMPLATE == hf_tokenizer(folder).chat_template


def test_chat_template_jinja_reads_as_text(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("smollm2")
    (folder / "chat_template.jinja").write_bytes(b"{{ 'a' }}\r\n{{ 'b' }}")
    assert info_of(folder)[1].chat_template == "{{ 'a' }}\n{{ 'b' }}" == hf_tokenizer(folder).chat_template


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{{ 'plain' }}", "{{ 'plain' }}"),
        ([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}], "D"),
        ([{"name": "rag", "template": "R"}, {"name": "tool_use", "template": "T"}], "R"),
        (None, None),
    ],
)
def test_chat_template_from_tokenizer_config(
    copy_of: Callable[[str], Path], value: Any, expected: Any
) -> None:
    folder = copy_of("smollm2")
    (folder / "chat_template.jinja").unlink()
    rewrite_json(folder / "tokenizer_config.json", chat_template=value)
    assert info_of(folder)[1].chat_template == expected
    if expected == "R":  # we take the first; transformers refuses until told which one to use
        with pytest.raises(ValueError, match="no default"):
            hf_tokenizer(folder).get_chat_template()
    elif expected is not None:
        assert hf_tokenizer(folder).get_chat_template() == expected


@pytest.mark.parametrize("value", [42, [{"name": "default"}], []])
def test_malformed_chat_template(copy_of: Callable[[str], Path], value: Any) -> None:
    folder = copy_of("smollm2")
    (folder / "chat_template.jinja").unlink()
    rewrite_json(folder / "tokenizer_config.json", chat_template=value)
    with pytest.raises(CheckpointError, match="chat_template must be") as e:
        info_of(folder)
    assert e.value.path == folder / "tokenizer_config.json"


def test_chat_template_not_utf8(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("qwen2.5")
    (folder / "chat_template.jinja").write_bytes(b"{{ '\xff\xfe' }}")
    with pytest.raises(CheckpointError, match="not UTF-8") as e:
        info_of(folder)
    assert e.value.path == folder / "chat_template.jinja" and "\n" not in str(e.value)


def test_legacy_special_tokens_map(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("qwen2.5")
    (folder / "special_tokens_map.json").write_text(json.dumps({"unk_token": {"content": "<|endoftext|>"}}))
    assert info_of(folder)[1].special_tokens == hf_tokenizer(folder).special_tokens_map
    assert info_of(folder)[1].special_tokens["unk_token"] == "<|endoftext|>"


def test_truncation_in_tokenizer_json_is_ignored_like_transformers(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("llama3")
    data = read_json(folder / "tokenizer.json")
    data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    tok, info = info_of(folder)
    assert len(encode(tok, info, TEXTS[1])) > 4
    assert encode(tok, info, TEXTS[1]) == hf_tokenizer(folder)(TEXTS[1]).input_ids


@pytest.mark.parametrize("flags", [{"add_bos_token": False}, {"add_bos_token": True, "add_eos_token": True}])
def test_add_bos_token_flags_are_ignored_like_transformers(
    copy_of: Callable[[str], Path], flags: dict[str, bool]
) -> None:
    """transformers 5 drops tokenizer_config.json's add_bos_token/add_eos_token when a
    tokenizer.json exists: its post-processor decides."""
    folder = copy_of("llama3")
    rewrite_json(folder / "tokenizer_config.json", **flags)
    tok, info = info_of(folder)
    assert info.add_bos and encode(tok, info, "hi") == hf_tokenizer(folder)("hi").input_ids


def test_post_processor_adding_eos_is_refused(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("llama3")
    data = read_json(folder / "tokenizer.json")
    data["post_processor"]["single"].append({"SpecialToken": {"id": "<|eot_id|>", "type_id": 0}})
    data["post_processor"]["special_tokens"]["<|eot_id|>"] = {
        "id": "<|eot_id|>",
        "ids": [3],
        "tokens": ["<|eot_id|>"],
    }
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"adds ids \[0\] before and \[3\] after") as e:
        info_of(folder)
    assert e.value.path == folder / "tokenizer.json"


@pytest.mark.parametrize("name", sorted(STYLES))
def test_manifest_round_trip(styled: Callable[[str], Path], name: str) -> None:
    _, info = info_of(styled(name))
    d = json.loads(json.dumps(info.to_dict()))
    assert TokenizerInfo.from_dict(info.path, d) == info
    assert set(d) >= {
        "bos_id",
        "eos_ids",
        "add_bos",
        "chat_template",
        "special_tokens",
        "generation_defaults",
    }


@pytest.mark.parametrize(
    "change",
    [
        {"eos_ids": []},
        {"eos_ids": [1.5]},
        {"add_bos": 1},
        {"bos_id": True},
        {"vocab_size": None},
        {"special_tokens": {"bos_token": 1}},
    ],
)
def test_from_dict_malformed(styled: Callable[[str], Path], change: dict[str, Any]) -> None:
    _, info = info_of(styled("llama3"))
    with pytest.raises(ArtifactError, match="rebuild the artifact"):
        TokenizerInfo.from_dict(info.path, {**info.to_dict(), **change})


# Escapes the fuzz tests (tests/fuzz/test_fuzz_tokenizer.py) found: RecursionError and a plain
# ValueError (Python's int digit limit) came out of json before.
@pytest.mark.parametrize("file", ["tokenizer_config.json", "generation_config.json"])
@pytest.mark.parametrize(
    ("text", "words"),
    [("[" * 100_000 + "]" * 100_000, "nested too deeply"), ("[" + "9" * 5000 + "]", "not valid JSON")],
    ids=["deep-nesting", "huge-integer"],
)
def test_json_that_json_refuses_oddly(
    copy_of: Callable[[str], Path], file: str, text: str, words: str
) -> None:
    folder = copy_of("llama3")
    (folder / file).write_text(text)
    with pytest.raises(CheckpointError, match=words) as e:
        info_of(folder)
    assert e.value.path == folder / file
