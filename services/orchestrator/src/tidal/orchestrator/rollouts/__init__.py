"""Rollouts: how a task's problems become scored groups of completions.

`generator` runs a step's groups through each task's rollout strategy (`strategies`,
picked once per task): single-turn calls, `episodes` of environment replies or
`tool_execution` results, a `verifiers` environment's own episodes, or an agent
program's episodes through the session gateway (`agent_episodes`).
"""
