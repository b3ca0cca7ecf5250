"""What the orchestrator builds from its own config before any peer is awaited: the tasks
and their mixture, the tokenizer and prompt rendering.

Each raises `ConfigError` for a bad task, tokenizer or chat config, so the process exits
2 before it serves or waits on anything (main.py). Kept apart from the entry point so
tests build exactly what a run would.
"""

from __future__ import annotations

import logging

from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.scoring.teacher import check_shared_tokenizer
from tidal.orchestrator.tasks import build_tasks
from tidal.text.loader import load_tokenizer

log = logging.getLogger(__name__)


def build_mixture(config: OrchestratorRunConfig) -> TaskMixture:
    """The run's tasks and their mixture (raises ConfigError for a bad task config)."""
    configs = config.orchestrator.task_list
    tasks = build_tasks(configs, seed=config.run.seed)
    for task in tasks:
        skipped = getattr(task, "skipped_records", 0)
        if skipped:
            log.warning("task %s: %d malformed records skipped", task.name, skipped)
    return TaskMixture(
        tasks,
        [c.weight for c in configs],
        seed=config.run.seed,
        curriculum=config.orchestrator.curriculum,
    )


def build_prompt_renderer(config: OrchestratorRunConfig) -> PromptRenderer:
    """The run's tokenizer and chat rendering (raises ConfigError for a bad tokenizer or
    `[orchestrator.chat]`, or a distillation teacher folder that tokenizes otherwise)."""
    tokenizer = load_tokenizer(config.run.tokenizer, model_path=config.model_folder())
    teacher_folder = config.orchestrator.distill.model_path
    if teacher_folder is not None and teacher_folder.is_dir():  # else: served elsewhere
        check_shared_tokenizer(tokenizer, teacher_folder)
    prompts = PromptRenderer.from_config(tokenizer, config.orchestrator.chat)
    log.info(
        "tokenizer %s; prompts %s",
        tokenizer.name,
        "through its chat template" if prompts.template else "as plain text",
    )
    return prompts
