"""What TRL's side of every comparison shares: the event log and the fixed GRPO settings.

Imported by the scripts beside it, which run in the throwaway venv `bench/rl_step.py`
makes; it imports nothing from Tidal. Events are JSON lines with `time.time()` stamps, so
the caller measures start-up and step times from its own clock: "start" (process start,
torch threads), "built" (trainer ready), "step" (each step end), "reward" (the step's mean
reward and completion tokens, logged after its "step"), "end".
"""

from __future__ import annotations

import json
import time
from typing import Any

from transformers import TrainerCallback
from trl import GRPOConfig


class Events(TrainerCallback):
    """Appends one JSON line per event to `path`, flushed at once."""

    def __init__(self, path: str, *, batch: int) -> None:
        self.file = open(path, "a")  # noqa: SIM115
        self.batch = batch  # completions per step: mean length x batch = completion tokens

    def write(self, **event: object) -> None:
        self.file.write(json.dumps(event) + "\n")
        self.file.flush()

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if logs and "reward" in logs:  # logged after on_step_end, for the same step
            self.write(
                event="reward",
                step=state.global_step,
                reward=float(logs["reward"]),
                completion_tokens=float(logs.get("completions/mean_length", 0.0)) * self.batch,
            )

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.write(event="step", step=state.global_step, t=time.time())


def grpo_config(*, workdir: str, steps: int, seed: int, **settings: Any) -> GRPOConfig:
    """GRPOConfig with the settings every comparison holds fixed, then `settings`.

    Fixed: no KL (beta 0), lower clip 0.2, temperature 1, one gradient step per generation
    batch, a log line per step, nothing saved or reported, TRL's CPU path (`use_cpu`), data
    loading in the main process.
    """
    fixed: dict[str, Any] = {
        "beta": 0.0,
        "epsilon": 0.2,
        "temperature": 1.0,
        "num_iterations": 1,
        "logging_steps": 1,
        "report_to": [],
        "save_strategy": "no",
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    return GRPOConfig(output_dir=workdir, max_steps=steps, seed=seed, **{**fixed, **settings})
