"""The Jinja environment chat templates are written for, on templates of our own."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from tidal.text.chat_template import ChatTemplate, ChatTemplateError

CHAT = [{"role": "user", "content": "Café 東京 <b>"}]


def render(source: str, **kwargs: Any) -> str:
    template = ChatTemplate(source, origin="test", special_tokens={"bos_token": "<s>"})
    return template.render(CHAT, add_generation_prompt=False, **kwargs)


def test_tojson_keeps_non_ascii_and_does_not_escape_html() -> None:
    assert render("{{ messages[0] | tojson }}") == json.dumps(CHAT[0], ensure_ascii=False)
    assert render("{{ messages[0] | tojson(indent=2) }}") == json.dumps(
        CHAT[0], ensure_ascii=False, indent=2
    )


def test_strftime_now_is_the_current_date() -> None:
    assert render("{{ strftime_now('%Y') }}") == str(datetime.now().year)


def test_blocks_trim_their_newline_and_leading_space() -> None:
    source = (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n"
        "[{{ m.content }}]\n{% endif %}\n{% endfor %}"
    )
    assert render(source) == "[Café 東京 <b>]\n"


def test_loop_controls_and_special_tokens_and_kwargs_are_available() -> None:
    source = (
        "{{ bos_token }}{% for i in range(5) %}{% if i == limit %}{% break %}{% endif %}"
        "{{ i }}{% endfor %}"
    )
    assert render(source, limit=3) == "<s>012"


def test_the_sandbox_refuses_unsafe_attribute_access() -> None:
    with pytest.raises(ChatTemplateError, match="failed"):
        render("{{ messages.__class__.__mro__[1].__subclasses__() }}")


def test_messages_cannot_be_mutated_by_the_template() -> None:
    with pytest.raises(ChatTemplateError, match="failed"):
        render("{{ messages.append({'role': 'x'}) }}")
