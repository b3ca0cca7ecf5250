"""Hugging Face chat templates (Jinja) rendered without `transformers`.

A folder's template is untrusted code, so it runs in jinja2's immutable sandbox, in the
environment Hugging Face templates are written for, and sees plain copies of the
messages (`None` values dropped: templates test for presence). `ChatEncoding` gives
both tokenizers `apply_chat_template` and `encode_chat` from their templates. The
end-of-turn token is found by rendering a probe chat, not from a table of model names.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tidal.common.errors import ConfigError
from tidal.text.tokenizer import Message

_PROBE_ASSISTANT = "tidal-probe-assistant-7f3a"
PROBE_CHAT: tuple[Message, ...] = (
    {"role": "user", "content": "tidal-probe-user-7f3a"},
    {"role": "assistant", "content": _PROBE_ASSISTANT},
)
"""A chat whose rendering shows what a template writes after an assistant's content."""


class ChatTemplateError(ConfigError):
    """A chat template is missing, does not compile, or raised while rendering."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def template_message(message: Message) -> dict[str, Any]:
    """A plain copy the template may read: `None` values dropped, and reasoning given
    under any of `REASONING_KEYS` also under `reasoning_content` (what most templates
    read) and `thinking` (gpt-oss), as `transformers` does."""
    plain = {k: v for k, v in dict(message).items() if v is not None}
    reasoning = next((plain[k] for k in REASONING_KEYS if k in plain), None)
    if reasoning is not None:
        plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
    return plain


def with_system_prompt(
    messages: Sequence[Message], system_prompt: str | None
) -> list[dict[str, Any]]:
    """Template copies of `messages`, `system_prompt` first unless the chat already opens
    with a system message."""
    plain = [template_message(m) for m in messages]
    if system_prompt is not None and not (plain and plain[0].get("role") == "system"):
        plain.insert(0, {"role": "system", "content": system_prompt})
    return plain


class ChatTemplate:
    """One compiled Jinja chat template plus the special-token strings it may read."""

    def __init__(self, source: str, *, origin: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self.origin = origin
        self.special_tokens = dict(special_tokens)
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template from {origin} does not compile: {e.message} (line {e.lineno})"
            ) from e

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool,
        system_prompt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        variables = {
            **self.special_tokens,
            **template_kwargs,
            "messages": with_system_prompt(messages, system_prompt),
            "tools": [dict(t) for t in tools] if tools is not None else None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**variables)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template from {self.origin} failed: {e}") from e

    def end_of_turn(self, specials: Iterable[str]) -> str | None:
        """The first of `specials` the template writes after an assistant message's content."""
        try:
            text = self.render(PROBE_CHAT, add_generation_prompt=False)
        except ChatTemplateError:
            return None
        return first_after_assistant(text, specials)


def first_after_assistant(rendered_probe: str, candidates: Iterable[str]) -> str | None:
    """The candidate occurring first after the assistant's content in a rendered `PROBE_CHAT`."""
    start = rendered_probe.find(_PROBE_ASSISTANT)
    if start < 0:
        return None
    rest = rendered_probe[start + len(_PROBE_ASSISTANT) :]
    found = [(at, c) for c in candidates if c and (at := rest.find(c)) >= 0]
    return min(found)[1] if found else None


def templates_from_config(
    value: str | list[dict[str, str]] | None, *, origin: str, special_tokens: Mapping[str, str]
) -> dict[str, ChatTemplate]:
    """`tokenizer_config.json`'s `chat_template` (a string, or a list of named ones)."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": ChatTemplate(value, origin=origin, special_tokens=special_tokens)}
    if isinstance(value, list) and all(isinstance(t, dict) for t in value):
        try:
            named = {t["name"]: t["template"] for t in value}
        except KeyError as e:
            raise ChatTemplateError(f"{origin}: a named chat template lacks {e}") from e
        return {
            n: ChatTemplate(src, origin=f"{origin} [{n}]", special_tokens=special_tokens)
            for n, src in named.items()
        }
    raise ChatTemplateError(
        f"{origin}: chat_template must be a string or a list of {{name, template}} objects, "
        f"got {type(value).__name__}"
    )


def choose_template(
    templates: Mapping[str, ChatTemplate], *, tools: object, origin: str
) -> ChatTemplate:
    """The template to render with: "tool_use" when tools are given and it exists, else
    "default"."""
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    if not templates:
        raise ChatTemplateError(
            f"{origin} has no chat template: add `chat_template` to tokenizer_config.json "
            "(or a chat_template.jinja file), or send plain-text prompts"
        )
    raise ChatTemplateError(
        f"{origin} has named chat templates {sorted(templates)} but none called 'default'"
    )


class ChatEncoding(ABC):
    """Chat rendering and encoding for a tokenizer class that supplies its templates and
    `encode_template_text` (both tokenizers inherit it; the Protocol stays structural)."""

    @abstractmethod
    def chat_template(self, *, tools: object = None) -> ChatTemplate:
        """The template to render with ("tool_use" when tools are given and it exists)."""

    @abstractmethod
    def encode_template_text(self, text: str) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> str:
        """The chat rendered as text by `chat_template(tools=tools)` (`options` as
        `ChatTemplate.render` takes them)."""
        return self.chat_template(tools=tools).render(messages, tools=tools, **options)

    def encode_chat(
        self, messages: Sequence[Message], *, add_generation_prompt: bool, **options: Any
    ) -> list[int]:
        """Ids of `apply_chat_template(...)` (same options): the template's own specials,
        nothing added."""
        text = self.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **options
        )
        return self.encode_template_text(text)
