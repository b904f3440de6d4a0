"""Chat prompts rendered as transformers' ``apply_chat_template(messages, tokenize=False,
add_generation_prompt=True)`` renders them: the same sandboxed Jinja environment and globals (see
``transformers/utils/chat_template_utils.py``, ``_compile_jinja_template``), the same variables."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ExporterError

# What a template may raise while rendering (it is code): Jinja's own errors, raise_exception's
# TemplateError included, and the Python errors of the operations it performs.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError, ArithmeticError, AttributeError)


class ChatTemplateError(ExporterError):
    """A chat template does not compile, or fails (or calls raise_exception) on the messages."""


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` marks the assistant's text for transformers'
    training masks; it renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's Extension API)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' filter: no HTML escaping (Jinja's own escapes <, >, &, ') and json.dumps options
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def render_chat(
    template: str,
    messages: list[dict[str, str]],
    special_tokens: dict[str, str],
    add_generation_prompt: bool = True,
    source: Path | None = None,
) -> str:
    """The prompt text transformers renders for ``messages``; ``special_tokens`` (``bos_token``,
    ``eos_token``, ...) are the template's variables, ``source`` the file errors name."""
    try:
        compiled = _compile(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(
            source, f"chat template does not compile: {_one_line(e.message or '')} (template line {e.lineno})"
        ) from e
    # transformers drops None-valued keys (an OpenAI-style "content": None) before rendering
    chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
    try:
        variables = {"messages": chat, "tools": None, "documents": None}
        return compiled.render(
            {**special_tokens, **variables, "add_generation_prompt": add_generation_prompt}
        )
    except _RENDER_ERRORS as e:
        what = "raised" if type(e) is jinja2.TemplateError else f"failed ({type(e).__name__})"
        raise ChatTemplateError(source, f"chat template {what}: {_one_line(str(e))}") from e


def chat_messages(user: str, system: str | None = None) -> list[dict[str, str]]:
    """One user turn, after a system message when ``system`` is given ("" is given: it replaces a
    template's default system prompt)."""
    first = [] if system is None else [{"role": "system", "content": system}]
    return [*first, {"role": "user", "content": user}]


def encode_chat(tokenizer: Any, text: str) -> list[int]:
    """A rendered chat prompt's ids, as ``apply_chat_template(..., tokenize=True)`` gives them: the
    template wrote the special tokens, so the tokenizer adds none."""
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    return ids
