"""One agent episode's session: its key's scope, its trace, its reward, why it cannot train.

A session serves its calls one at a time (a lock), so its trajectories grow in the order
the policy answered. The policy's turn comes from `generate`, the orchestrator's own path
to inference (in-flight limit, staleness window, replica affinity), never from the agent.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidal.orchestrator.completions import Completion
from tidal.orchestrator.gateway.trace import EpisodeTrace
from tidal.orchestrator.tasks.base import Problem

GenerateFn = Callable[[list[int], int, int, int], Awaitable[list[Completion]]]
"""`generate(prompt_ids, turns_so_far, max_tokens, n)`: the policy's `n` choices of a turn."""


@dataclass
class AgentSession:
    problem: Problem
    trace: EpisodeTrace
    generate: GenerateFn
    max_calls: int
    max_context: int
    max_tokens: int
    id: str = field(default_factory=lambda: "s-" + secrets.token_hex(12))
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reward: float | None = None
    failure: str = ""
    """Set when a call failed in a way that leaves the trace incomplete (inference error):
    the episode is then dropped with this reason, never trained half."""
    context_full: bool = False
