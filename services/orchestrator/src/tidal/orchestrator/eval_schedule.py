"""When the loop evaluates: at the start, after the warm-up, every `eval.every` RL steps
and after the last step.

Each evaluation runs between steps on whatever version inference has loaded then, and
its figures are keyed `eval/...` (`eval_start/...` for version 0's) so the step's metrics
line carries them. Kept apart from the loop so the loop reads as the pipeline and this as
its schedule; `evaluation.py` says how one evaluation is made.
"""

from __future__ import annotations

import time

from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.evaluation import evaluate
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.rollouts.generator import RolloutGenerator
from tidal.orchestrator.staleness import AsyncWindow


class EvalSchedule:
    """The run's evaluations, each on the version inference has loaded."""

    def __init__(
        self,
        config: OrchestratorConfig,
        *,
        generator: RolloutGenerator,
        mixture: TaskMixture,
        window: AsyncWindow,
    ) -> None:
        self.config = config
        self.generator = generator
        self.mixture = mixture
        self.window = window

    async def at_start(self) -> dict[str, float]:
        """Held-out figures of version 0, keyed `eval_start/...`."""
        await self.window.wait_loaded(0)
        started = time.monotonic()
        results = await evaluate(self.generator, self.mixture, self.config.eval, step=0)
        results["eval/policy_version"] = float(self.window.loaded)
        results["eval/seconds"] = time.monotonic() - started
        return {"eval_start/" + k.removeprefix("eval/"): v for k, v in results.items()}

    async def if_due(self, step: int) -> dict[str, float]:
        """The figures after RL step `step` when it is an evaluation step, else none."""
        every = self.config.eval.every
        rl_index = step - self.config.warmup_steps
        if every <= 0 or (rl_index % every != 0 and step != self.config.total_steps):
            return {}
        return await self.now(step)

    async def now(self, step: int) -> dict[str, float]:
        """The figures of an evaluation made now (none when evaluation is off)."""
        if self.config.eval.every <= 0:
            return {}
        started = time.monotonic()
        results = await evaluate(self.generator, self.mixture, self.config.eval, step=step)
        results["eval/policy_version"] = float(self.window.loaded)
        results["eval/seconds"] = time.monotonic() - started
        return results
