"""Rollouts: how a task's problems become scored groups of completions.

`generator` runs a step's groups through each task's rollout strategy (`strategies`,
picked once per task): single-turn calls, `episodes` of environment replies or
`tool_execution` results, or a `verifiers` environment's own episodes.
"""
