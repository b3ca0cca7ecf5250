"""Problems → prompt ids, episode turns and warm-up targets, with or without the chat template.

One object, built at start-up from the tokenizer and `[orchestrator.chat]`, owns every
place a problem's text becomes ids (rollout and evaluation prompts, episode turns, warm-up
targets), so they cannot disagree. With the template on, a warm-up target is built the way
an episode is, so SFT trains on the sequences RL later samples. Inconsistent settings are
a `ConfigError` from `from_config`, raised before any peer is awaited.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidal.batch.packing import TrainSample
from tidal.common.errors import ConfigError
from tidal.orchestrator.config import ChatConfig
from tidal.orchestrator.rollouts.episodes import ChatTurns, EpisodeTurns, PlainTurns
from tidal.orchestrator.tasks.base import Problem, Task
from tidal.text.conversation import ChatRendering, uses_template
from tidal.text.tokenizer import Tokenizer

TEMPLATE_KEY = "orchestrator.chat.template"


@dataclass(frozen=True)
class PromptRenderer:
    """How this run turns problems into ids (see the module docstring)."""

    rendering: ChatRendering

    @classmethod
    def from_config(cls, tokenizer: Tokenizer, chat: ChatConfig) -> PromptRenderer:
        """Resolve `chat.template` for `tokenizer`; ConfigError on inconsistent keys."""
        template = uses_template(tokenizer, chat.template, key=TEMPLATE_KEY)
        template_only = {
            "system_prompt": chat.system_prompt is not None,
            "template_kwargs": bool(chat.template_kwargs),
        }
        unused = [key for key, is_set in template_only.items() if is_set and not template]
        if unused:
            raise ConfigError(
                f"orchestrator.chat.{unused[0]} is set but prompts are plain text "
                f"({TEMPLATE_KEY} = {chat.template!r} with tokenizer {tokenizer.name}): "
                f'set {TEMPLATE_KEY} = "on", or remove orchestrator.chat.{unused[0]}'
            )
        rendering = ChatRendering(
            tokenizer,
            template,
            system_prompt=chat.system_prompt,
            template_kwargs=dict(chat.template_kwargs),
        )
        return cls(rendering)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.rendering.tokenizer

    @property
    def template(self) -> bool:
        """Whether prompts are rendered with the chat template."""
        return self.rendering.template

    @property
    def stop_ids(self) -> list[int]:
        """Every id that ends a generation (`eos_ids`)."""
        return list(self.tokenizer.eos_ids)

    def messages(self, problem: Problem) -> list[dict[str, Any]]:
        """The problem's chat messages, or its prompt as one user message."""
        if problem.messages:
            return [dict(m) for m in problem.messages]
        return [{"role": "user", "content": problem.prompt}]

    def prompt_ids(self, problem: Problem) -> list[int]:
        """The ids a rollout of `problem` starts from."""
        if self.template:
            return self.rendering.prompt_ids(self.messages(problem), problem.tools)
        if problem.tools:
            raise self._needs_template(problem.task)
        return self.tokenizer.encode(problem.prompt)

    def episode_turns(self, problem: Problem) -> EpisodeTurns:
        """A fresh multi-turn episode of `problem` (its prompt is `prompt_ids(problem)`)."""
        if not self.template:
            return PlainTurns(self.tokenizer)
        episode = self.rendering.episode(problem.tools)
        episode.start(self.messages(problem))
        return ChatTurns(episode)

    def reference_sample(self, problem: Problem) -> TrainSample:
        """The warm-up target: the prompt, then the reference answers (mask 1) with the
        environment's followups between them (mask 0)."""
        if self.template:
            prompt, completion, mask = self._chat_reference(problem)
        else:
            prompt = self.prompt_ids(problem)
            completion, mask = self._plain_reference(problem)
        return TrainSample(
            prompt_ids=tuple(prompt),
            completion_ids=tuple(completion),
            advantage=1.0,
            completion_mask=() if all(m == 1.0 for m in mask) else tuple(mask),
        )

    def check_tasks(self, tasks: Sequence[Task]) -> None:
        """ConfigError (at start) if a task offers tools but prompts are plain text."""
        for task in tasks:
            if task.tools and not self.template:
                raise self._needs_template(task.name)

    def _needs_template(self, task: str) -> ConfigError:
        return ConfigError(
            f"task {task or '?'} offers tools, whose calls and results are chat "
            f"messages, but prompts are plain text with tokenizer {self.tokenizer.name}: "
            f'set {TEMPLATE_KEY} = "on"'
        )

    def _plain_reference(self, problem: Problem) -> tuple[list[int], list[float]]:
        tokenizer, eos = self.tokenizer, self.tokenizer.eos_id
        tokens = [*tokenizer.encode(problem.reference, add_special_tokens=False), eos]
        mask = [1.0] * len(tokens)
        for text, reference in problem.followups:
            env_ids = tokenizer.encode(text, add_special_tokens=False)
            answer = [*tokenizer.encode(reference, add_special_tokens=False), eos]
            tokens += env_ids + answer
            mask += [0.0] * len(env_ids) + [1.0] * len(answer)
        return tokens, mask

    def _chat_reference(self, problem: Problem) -> tuple[list[int], list[int], list[float]]:
        chat = [*self.messages(problem)]
        if problem.demonstration:
            chat += [dict(m) for m in problem.demonstration]
        else:
            chat.append({"role": "assistant", "content": problem.reference})
        for text, reference in problem.followups:
            chat += [{"role": "user", "content": text}, {"role": "assistant", "content": reference}]
        episode = self.rendering.conversation(chat, problem.tools)
        prompt_len = episode.loss_mask.index(1)
        return (
            episode.ids[:prompt_len],
            episode.ids[prompt_len:],
            [float(m) for m in episode.loss_mask[prompt_len:]],
        )
