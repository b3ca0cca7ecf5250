"""Chat rendering shared by RL prompts and SFT data, and a conversation as an episode.

`ChatRendering` is the one set of rendering options the orchestrator and `tidal sft` both
hold, so a prompt becomes the same ids in either. A conversation to train on is built
turn by turn with `Episode`, as a rollout is, so SFT trains on the ids a policy would
have seen producing it (assistant turns under mask 1, through the end-of-turn token),
not on a from-scratch rendering no rollout produces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.chat_template import ChatTemplateError
from tidal.text.episode import Episode, EpisodeRenderError, end_of_turn
from tidal.text.tokenizer import Message, Tokenizer

TemplateMode = Literal["auto", "on", "off"]
Tools = Sequence[Mapping[str, Any]] | None
ASSISTANT = "assistant"


def has_chat_template(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` can render a chat (a folder without a template cannot)."""
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], add_generation_prompt=True
        )
    except ChatTemplateError:
        return False
    return True


def uses_template(tokenizer: Tokenizer, mode: TemplateMode, *, key: str) -> bool:
    """Resolve `mode` for `tokenizer`; `key` is the config key named in the error."""
    if mode == "off":
        return False
    available = has_chat_template(tokenizer)
    if mode == "on" and not available:
        raise ConfigError(
            f'{key} = "on" but tokenizer {tokenizer.name} has no chat template: add one to '
            f"the model folder (tokenizer_config.json `chat_template`), or set {key} to "
            '"auto" or "off" for plain-text prompts'
        )
    if mode == "auto":
        return available and not isinstance(tokenizer, ByteTokenizer)
    return True


@dataclass(frozen=True)
class ChatRendering:
    """How prompts become ids: the tokenizer, and whether and how its template is used."""

    tokenizer: Tokenizer
    template: bool
    system_prompt: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def episode(self, tools: Tools = None) -> Episode:
        """An empty episode rendered with these options (and `tools`, if any)."""
        return Episode(
            self.tokenizer,
            system_prompt=self.system_prompt,
            tools=tools or None,
            template_kwargs=dict(self.template_kwargs),
        )

    def prompt_ids(self, messages: Sequence[Message], tools: Tools = None) -> list[int]:
        """`messages` rendered with the generation prompt (template on only)."""
        return self.tokenizer.encode_chat(
            messages,
            add_generation_prompt=True,
            system_prompt=self.system_prompt,
            tools=tools or None,
            **self.template_kwargs,
        )

    def assistant_turn_ids(
        self, history: Sequence[Message], message: Message, tools: Tools = None
    ) -> list[int]:
        """Ids of assistant `message` after `history`'s generation prompt, through the
        end-of-turn token (what a policy emits for it)."""
        options = {"system_prompt": self.system_prompt, "tools": tools or None}
        options.update(self.template_kwargs)
        prompt = self.tokenizer.apply_chat_template(history, add_generation_prompt=True, **options)
        full = self.tokenizer.apply_chat_template(
            [*history, message], add_generation_prompt=False, **options
        )
        if not full.startswith(prompt):
            raise EpisodeRenderError(
                f"{self.tokenizer.name}: the chat template renders an assistant turn that does "
                "not continue its own generation prompt; cannot tell the turn's tokens apart"
            )
        turn = full[len(prompt) :]
        eot = end_of_turn(self.tokenizer)
        if eot is not None and eot[0] in turn:
            turn = turn[: turn.index(eot[0]) + len(eot[0])]
        return self.tokenizer.encode_template_text(turn)

    def conversation(self, messages: Sequence[Message], tools: Tools = None) -> Episode:
        """`messages` as one episode: assistant turns under mask 1, the rest under 0."""
        last = max((i for i, m in enumerate(messages) if m.get("role") == ASSISTANT), default=-1)
        if last < 0:
            raise ValueError("a conversation to train on needs an assistant message")
        if messages[0].get("role") == ASSISTANT:
            raise ValueError("a conversation cannot open with an assistant message")
        episode = self.episode(tools)
        pending: list[Message] = []
        for message in messages[: last + 1]:
            if message.get("role") != ASSISTANT:
                pending.append(message)
                continue
            if not episode.ids:
                episode.start(pending)
            else:  # with no message between two assistant turns: just the next header
                episode.add_messages(pending)
            pending = []
            episode.add_assistant(self.assistant_turn_ids(episode.messages, message, tools))
        return episode
