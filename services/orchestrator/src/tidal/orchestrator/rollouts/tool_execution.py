"""Run one assistant turn's tool calls: concurrently, each under a deadline, never raising.

Every call gets exactly one `tool` message, in the order the policy wrote them: the tool's
text, or an error the policy can read (an invalid call, an exception, a timeout). A
failing tool costs its episode an error result, not the step. The tools are the task's
`Tool.run` callables; untrusted code is sandboxed behind that callable, not here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidal.orchestrator.completions import ToolStats
from tidal.orchestrator.config import ToolsConfig
from tidal.orchestrator.tasks.base import Problem, Tool
from tidal.text.tool_calls import InvalidCall, ToolCall, ToolCallParser


@dataclass(frozen=True)
class ToolUse:
    """What an episode with tools needs: the task's tools, the parser and the budget."""

    tools: Mapping[str, Tool]
    parser: ToolCallParser
    config: ToolsConfig

    @classmethod
    def of(cls, tools: Sequence[Tool], parser: ToolCallParser, config: ToolsConfig) -> ToolUse:
        return cls({t.name: t for t in tools}, parser, config)


async def _run_one(
    call: ToolCall, tool: Tool, problem: Problem, config: ToolsConfig
) -> tuple[str, bool]:
    """The call's result text and whether it failed."""
    try:
        async with asyncio.timeout(config.call_timeout_s):
            result = await tool.run(problem, **call.arguments)
    except TimeoutError:
        return f"error: {call.name} timed out after {config.call_timeout_s:g}s", True
    except Exception as e:  # a tool's bug is the episode's error result, not the step's
        return f"error: {call.name} raised {type(e).__name__}: {e}", True
    text = str(result)
    if len(text) > config.max_result_chars:
        text = text[: config.max_result_chars] + " [truncated]"
    return text, False


async def run_calls(
    calls: Sequence[ToolCall | InvalidCall], use: ToolUse, problem: Problem
) -> tuple[list[dict[str, Any]], ToolStats]:
    """The `tool` messages answering `calls` (same order), and what it cost."""
    started = time.monotonic()

    async def answer(call: ToolCall | InvalidCall) -> tuple[str, bool]:
        if isinstance(call, InvalidCall):
            return f"error: {call.error}", False
        tool = use.tools.get(call.name)
        if tool is None:  # offered in the prompt but not run by the task
            return f"error: {call.name} is not available", True
        return await _run_one(call, tool, problem, use.config)

    results = await asyncio.gather(*(answer(c) for c in calls))
    messages = [
        {"role": "tool", "name": call.name, "content": text}
        for call, (text, _) in zip(calls, results, strict=True)
    ]
    invalid = sum(isinstance(c, InvalidCall) for c in calls)
    stats = ToolStats(
        calls=len(calls),
        parse_failures=invalid,
        errors=sum(failed for _, failed in results),
        seconds=time.monotonic() - started,
    )
    return messages, stats
