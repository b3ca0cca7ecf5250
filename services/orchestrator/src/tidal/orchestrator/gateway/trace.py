"""An agent episode's calls as token-faithful trajectories: what the policy saw and sampled.

A call whose history repeats a trajectory's messages and the reply it got (the usual chat
loop) extends that trajectory: the new messages are rendered after the ids already held
(`tidal.text.Episode`, which only appends), so the prompt is exactly the ids sent before,
the ids sampled, then the new messages' ids under loss mask 0. Any other call (a trimmed,
edited or re-rendered history, other tools) starts a new trajectory from its own rendering.
A call of `n` choices records the first in its trajectory and each other one in a fork
whose prompt is that call's ids, so a later call extends whichever choice it echoes and no
earlier turn is held twice. Each trajectory with a model turn becomes one sample; ids are
never re-tokenized from text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tidal.orchestrator.completions import Completion, ToolStats
from tidal.text.conversation import ChatRendering
from tidal.text.episode import Episode, EpisodeRenderError
from tidal.text.tool_calls import ParsedTurn, ToolCall


@dataclass
class Trajectory:
    """One chain of calls: `episode.ids` = prompt, then turns and messages in order."""

    episode: Episode
    tools_key: bytes
    keys: list[str] = field(default_factory=list)
    """The message keys `episode.ids` render, the replies the policy gave included."""
    prompt_len: int = 0
    logprobs: list[float] = field(default_factory=list)
    """Per id after the prompt: the sampled token's logprob, 0 at message ids."""
    versions: list[int] = field(default_factory=list)
    """Per sampled id: the policy version that produced it."""
    turns: list[str] = field(default_factory=list)
    stopped: bool = True
    tools: ToolStats = field(default_factory=ToolStats)

    def fork(self) -> Trajectory:
        """A trajectory whose prompt is all of this one's ids (another choice of its call)."""
        episode = self.episode
        copy = dataclasses.replace(
            episode,
            ids=list(episode.ids),
            loss_mask=[0] * len(episode.ids),
            messages=[dict(m) for m in episode.messages],
        )
        return Trajectory(copy, self.tools_key, prompt_len=len(copy.ids))

    def add_turn(self, keys: list[str], turn: RecordedTurn) -> None:
        """The policy's turn after the call whose message keys are `keys`."""
        self.episode.add_assistant(turn.turn.token_ids)
        self.logprobs += list(turn.turn.logprobs)
        self.versions += list(turn.turn.policy_versions)
        self.turns.append(turn.text)
        self.stopped = turn.turn.stopped
        self.keys = [*keys, turn.reply_key]
        valid = sum(isinstance(c, ToolCall) for c in turn.parsed.calls)
        self.tools += ToolStats(calls=valid, parse_failures=len(turn.parsed.calls) - valid)

    def sample(self, index: int) -> Completion:
        mask = self.episode.loss_mask[self.prompt_len :]
        return Completion(
            index=index,
            token_ids=tuple(self.episode.ids[self.prompt_len :]),
            logprobs=tuple(self.logprobs),
            policy_versions=tuple(self.versions),
            stopped=self.stopped,
            loss_mask=tuple(float(m) for m in mask),
            turns=tuple(self.turns),
            tools=self.tools,
            prompt_ids=tuple(self.episode.ids[: self.prompt_len]),
        )


@dataclass(frozen=True)
class RecordedTurn:
    """One choice the policy sampled for a call, and the key of the message it became."""

    turn: Completion
    text: str
    parsed: ParsedTurn
    reply_key: str


@dataclass(frozen=True)
class PendingPrompt:
    """A call's prompt, appended to `trajectory` until the turn is recorded or undone."""

    trajectory: Trajectory
    ids: list[int]
    keys: list[str]
    held: int
    """Length of the trajectory's ids before this call (to undo a refused call)."""
    held_messages: int


class EpisodeTrace:
    """The trajectories of one episode's calls."""

    def __init__(self, rendering: ChatRendering) -> None:
        self.rendering = rendering
        self.trajectories: list[Trajectory] = []

    def prompt(
        self, messages: Sequence[dict[str, Any]], keys: list[str], tools: Sequence[dict[str, Any]]
    ) -> PendingPrompt:
        """The ids of a call: its trajectory's ids when it extends one, else a new one's."""
        tools_key = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
        for trajectory in reversed(self.trajectories):
            held = len(trajectory.keys)
            if (
                trajectory.turns
                and trajectory.tools_key == tools_key
                and len(keys) > held
                and keys[:held] == trajectory.keys
            ):
                episode = trajectory.episode
                before, before_messages = len(episode.ids), len(episode.messages)
                try:  # appends nothing when it raises
                    episode.add_messages(messages[held:])
                except EpisodeRenderError:
                    break  # the template cannot append here: render the call afresh
                trajectory.logprobs += [0.0] * (len(episode.ids) - before)
                return PendingPrompt(trajectory, list(episode.ids), keys, before, before_messages)
        episode = self.rendering.episode(list(tools) or None)
        ids = episode.start(messages)
        trajectory = Trajectory(episode, tools_key, prompt_len=len(ids))
        self.trajectories.append(trajectory)
        return PendingPrompt(trajectory, list(ids), keys, 0, 0)

    def undo(self, pending: PendingPrompt) -> None:
        """Forget a call that was refused or failed before its turn was recorded."""
        trajectory = pending.trajectory
        if pending.held == 0:
            self.trajectories.remove(trajectory)
            return
        episode = trajectory.episode
        del episode.ids[pending.held :], episode.loss_mask[pending.held :]
        del episode.messages[pending.held_messages :]
        del trajectory.logprobs[pending.held - trajectory.prompt_len :]

    def record(self, pending: PendingPrompt, turns: Sequence[RecordedTurn]) -> None:
        """The policy's choices for `pending`, their ids verbatim: the first extends its
        trajectory, each other one a fork made before the first is appended."""
        forks = [pending.trajectory.fork() for _ in turns[1:]]
        for trajectory, turn in zip([pending.trajectory, *forks], turns, strict=True):
            trajectory.add_turn(pending.keys, turn)
        self.trajectories += forks

    def samples(self) -> list[Completion]:
        """One sample per trajectory with a model turn, in the order they started."""
        return [t.sample(0) for t in self.trajectories if t.turns]

    @property
    def calls(self) -> int:
        return sum(len(t.turns) for t in self.trajectories)
