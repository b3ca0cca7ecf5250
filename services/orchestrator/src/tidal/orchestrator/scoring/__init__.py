"""Scoring: a task's reward source, chosen once per task (`scorers`).

Verifiers run in warm worker processes (`verifier_pool`), untrusted code in the `sandbox`;
a task with a `reward` config is scored by an LLM `judge` or a `reward_model` instead.
"""
