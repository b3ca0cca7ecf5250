"""Rewards from models: an LLM judge on an OpenAI-compatible endpoint, or a reward model.

`config` (pydantic only, read by the task configs and the launcher), `rubric` (a judge's
prompt and score parsing), `judge`, `reward_model`, and `build` (a run's, per task).
"""
