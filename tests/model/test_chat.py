"""Chat rendering: parity with transformers' apply_chat_template, and template errors as one-line
project errors naming the file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.errors import ExporterError
from exporter.model.chat import ChatTemplateError, chat_messages, encode_chat, render_chat
from tests.model.test_tokenizer import STYLES, hf_tokenizer, info_of, styled  # noqa: F401 (styled: fixture)

CONVERSATIONS = {
    "user": chat_messages("What is 2 + 2? Answer «briefly» 🙂"),
    "system": chat_messages("hi", system="You are terse.\nVery terse."),
    "empty system": chat_messages("hi", system=""),
    "multi-turn": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hello <b>there</b>"},
        {"role": "assistant", "content": "  Hi!  "},
        {"role": "user", "content": "Again, with <|im_end|> in it"},
    ],
}


def hf_ids(out: Any) -> list[int]:
    """apply_chat_template(tokenize=True) returns a BatchEncoding in transformers 5, ids in 4."""
    return list(out["input_ids"] if not isinstance(out, list) else out)


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(STYLES))
def test_render_and_ids_match_transformers(
    styled: Callable[[str], Path],  # noqa: F811
    name: str,
    conversation: str,
) -> None:
    folder = styled(name)
    tok, info = info_of(folder)
    hf = hf_tokenizer(folder)
    messages = CONVERSATIONS[conversation]
    assert info.chat_template is not None
    for prompt in (True, False):
        text = render_chat(info.chat_template, messages, info.special_tokens, add_generation_prompt=prompt)
        assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
    text = render_chat(info.chat_template, messages, info.special_tokens)
    expected = hf_ids(hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))
    assert encode_chat(tok, text) == expected


def test_llama3_chat_starts_with_one_bos(styled: Callable[[str], Path]) -> None:  # noqa: F811
    """The template writes BOS; the rendered text is encoded without the post-processor's."""
    tok, info = info_of(styled("llama3"))
    assert info.chat_template is not None and info.add_bos
    ids = encode_chat(tok, render_chat(info.chat_template, chat_messages("hi"), info.special_tokens))
    assert ids[0] == info.bos_id and ids[1] != info.bos_id


JINJA_FEATURES = {
    # trim_blocks and lstrip_blocks: block tags on their own lines leave no blank lines or indents
    "layout": "{% for m in messages %}\n    {% if m.role == 'user' %}\n  U: {{ m.content }}\n"
    "    {% endif %}\n{% endfor %}\n",
    "loopcontrols": "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
    "{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.role }}]{% endfor %}",
    "tojson": "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2, sort_keys=True) }}",
    "generation tag": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% endfor %}{{ ns.n }}{{ bos_token }}{{ eos_token }}",
    "tools and documents": "{{ tools is none }} {{ documents is none }} {{ add_generation_prompt }}",
    "strftime_now": "{{ strftime_now('%Y') }}",
}


@pytest.mark.parametrize("feature", sorted(JINJA_FEATURES))
def test_jinja_environment_matches_transformers(styled: Callable[[str], Path], feature: str) -> None:  # noqa: F811
    _, info = info_of(styled("llama3"))
    messages = CONVERSATIONS["multi-turn"]
    template = JINJA_FEATURES[feature]
    expected = hf_tokenizer(styled("llama3")).apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    assert render_chat(template, messages, info.special_tokens) == expected


def test_none_valued_keys_are_dropped_like_transformers(styled: Callable[[str], Path]) -> None:  # noqa: F811
    template = "{% for m in messages %}{{ m.role }}:{{ m.content is defined }};{% endfor %}"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None},
    ]
    expected = hf_tokenizer(styled("smollm2")).apply_chat_template(
        messages, chat_template=template, tokenize=False
    )
    assert (
        render_chat(template, messages, {}, add_generation_prompt=False)
        == expected
        == "user:True;assistant:False;"
    )


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "{{ raise_exception('Conversation roles must alternate\nuser/assistant') }}",
            "chat template raised: Conversation roles must alternate user/assistant",
        ),
        ("{% for m in messages %}{{ m.content }}", "does not compile: .*template line 1"),
        ("{{ messages[0].content + 1 }}", r"chat template failed \(TypeError\)"),
        ("{{ messages.__class__ }}{{ ''.__class__.__mro__ }}", "chat template failed"),
    ],
)
def test_template_errors_are_one_line_naming_the_file(template: str, message: str) -> None:
    source = Path("/ckpt/chat_template.jinja")
    with pytest.raises(ChatTemplateError, match=message) as e:
        render_chat(template, chat_messages("hi"), {}, source=source)
    assert isinstance(e.value, ExporterError) and e.value.path == source
    assert "\n" not in str(e.value) and str(e.value).startswith(str(source))


def test_raise_exception_without_source() -> None:
    with pytest.raises(ChatTemplateError, match=r"^chat template raised: no system role$"):
        render_chat("{{ raise_exception('no system role') }}", chat_messages("hi"), {})


def test_chat_messages() -> None:
    assert chat_messages("u") == [{"role": "user", "content": "u"}]
    assert chat_messages("u", "s") == [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
