"""A `verifiers` environment as a Tidal task (`type = "verifiers"`).

The environment runs unchanged: verifiers loads its taskset (and `Env`) by id, its harness
program plays the policy through verifiers' interception server, and verifiers' own train
client renders each turn with the model folder's tokenizer and calls inference's
`/inference/v1/generate`. Tidal only reads the finished episodes (`verifiers_episodes`)
and feeds them to the usual group and advantage path; the environment's reward replaces the
verifier. `verifiers` is an optional extra, imported when such a task is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.rollouts.verifiers_episodes import PolicyVersions, episode_completion
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.task_config import VerifiersTaskConfig
from tidal.orchestrator.tasks.base import Problem, Split, Task

EXTRA = "pip install 'tidal-orchestrator[verifiers]'"
KEY_VAR = "TIDAL_INFERENCE_API_KEY"
"""Where the train client reads inference.http's key (runtimes drop `*API_KEY*` variables
from the harness programs they start)."""


def import_verifiers() -> ModuleType:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ConfigError(
            f'orchestrator task type "verifiers" needs the verifiers library: {EXTRA} ({exc})'
        ) from exc
    return vf


def _local_chat_program(versions: PolicyVersions) -> None:
    """Run harness programs offline with this interpreter, and record policy versions.

    verifiers prepares its chat program (the `null` and `bash` harnesses) with `uv`, which
    would download the program's dependencies; they are verifiers' own, installed here, so
    the prepared interpreter is this one. Its HTTP clients get the versions hook."""
    from verifiers.v1.clients import base
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    data = CHAT_PROGRAM_SOURCE.encode()
    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    SubprocessRuntime._interpreters[str(path)] = sys.executable
    build = base.build_async_httpx
    if getattr(build, "tidal_versions", None) is versions:
        return

    def build_with_hook(config: Any) -> Any:
        client = build(config)
        client.event_hooks["response"].append(versions.on_response)
        return client

    build_with_hook.tidal_versions = versions  # type: ignore[attr-defined]
    base.build_async_httpx = build_with_hook


class VerifiersTask(Task):
    name = "verifiers"

    def __init__(self, config: VerifiersTaskConfig) -> None:
        self.config = config
        self.vf = import_verifiers()
        agent: dict[str, Any] = {"runtime": {"type": "subprocess"}}
        if config.harness:
            agent["harness"] = {"id": config.harness}
        raw = {"taskset": {"id": config.env, **config.args}, "agent": agent}
        try:
            env_config = self.vf.resolve_env_config(raw)
            self.env = self.vf.load_environment(env_config)
        except Exception as exc:  # the environment's own code: any refusal is the config's
            raise ConfigError(f"orchestrator task verifiers env {config.env!r}: {exc}") from exc
        self.name = config.env
        bounded = self.env.taskset.bounded
        self._tasks: list[Any] = list(self.env.taskset) if bounded else []
        self._source = iter(()) if bounded else iter(self.env.taskset)
        self._endpoint: dict[str, str] | None = None
        self._serving: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()
        self.versions = PolicyVersions()

    def connect(self, *, base_url: str, model: str, model_folder: Path, api_key: str) -> None:
        """Where the train client generates: inference.http's URL, served model name and
        key, and the folder whose tokenizer renders prompts (the run's model)."""
        os.environ[KEY_VAR] = api_key or "unused"
        self._endpoint = {"base_url": base_url, "model": model, "folder": str(model_folder)}

    def _task(self, index: int) -> Any:
        while len(self._tasks) <= index:
            task = next(self._source, None)
            if task is None:
                return self._tasks[index % len(self._tasks)]
            self._tasks.append(task)
        return self._tasks[index]

    def size(self, split: Split = "train") -> int | None:
        return len(self._tasks) if self.env.taskset.bounded else None

    def problem(self, index: int, *, split: Split = "train") -> Problem:
        prompt = self._task(index).data.prompt
        text = prompt if isinstance(prompt, str) else str(prompt or "")
        return Problem(
            prompt=text,
            reference="",
            task=self.name,
            uid=f"{self.name}/{split}/{index}",
            metadata={"verifiers_index": index},
        )

    def verify(self, problem: Problem, completion: str) -> float:
        """Unused: episodes carry the environment's own reward (`Completion.reward`)."""
        return 0.0

    @property
    def max_completion_chars(self) -> int:
        return self.config.max_answer_chars

    async def _env(self) -> Any:
        async with self._lock:
            if self._serving is None:
                _local_chat_program(self.versions)
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(self.env.serving())
                self._serving = stack
        return self.env

    async def rollouts(
        self,
        problem: Problem,
        *,
        n: int,
        temperature: float,
        top_p: float,
        seed: int,
        max_tokens: int,
    ) -> list[Completion]:
        """n episodes of `problem`'s verifiers task, each sampled with its own seed."""
        if self._endpoint is None:
            raise RuntimeError("VerifiersTask.connect was not called")
        from verifiers.v1.env import RunSlot

        vf, env = self.vf, await self._env()
        task = self._task(problem.metadata["verifiers_index"])
        client = vf.TrainClientConfig(
            base_url=self._endpoint["base_url"],
            api_key_var=KEY_VAR,
            renderer_model_name=self._endpoint["folder"],
        )

        async def episode(i: int) -> Completion:
            sampling = vf.SamplingConfig(
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_tokens,
                seed=derive_seed(seed, i),
            )
            ctx = vf.ModelContext(model=self._endpoint["model"], client=client, sampling=sampling)
            done = await env.run_slot(RunSlot(task), ctx)
            return episode_completion(done, i, self.versions)

        return list(await asyncio.gather(*(episode(i) for i in range(n))))

    async def aclose(self) -> None:
        """Stop the environment's serving resources (interception servers, tool servers)."""
        if self._serving is not None:
            await self._serving.aclose()
            self._serving = None


def connect_tasks(tasks: list[Task], *, inference: dict[str, Any], model: Path | None) -> None:
    """Point every verifiers task at inference's HTTP server (the run's `[inference.http]`,
    replica 0); ConfigError naming the key when the run cannot serve them."""
    found = [t for t in tasks if isinstance(t, VerifiersTask)]
    if not found:
        return
    http = inference.get("http") or {}
    need = 'orchestrator task type "verifiers" generates through inference\'s HTTP server'
    if not http.get("enabled"):
        raise ConfigError(f"{need}: set inference.http.enabled = true")
    if http.get("tls"):
        raise ConfigError(f"{need} over plain HTTP on this host: unset inference.http.tls")
    if not http.get("port"):
        raise ConfigError(f"{need}: set inference.http.port (`tidal rl` picks a free one)")
    if model is None:
        raise ConfigError(
            f"{need}, with prompts rendered by a model folder's tokenizer: set "
            "trainer.model.path to a Hugging Face folder"
        )
    key = ""
    if http.get("api_key_file"):
        try:
            key = Path(http["api_key_file"]).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"inference.http.api_key_file: {exc}") from exc
    host = http.get("host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    for task in found:
        task.connect(
            base_url=f"http://{host}:{int(http['port'])}/v1",
            model=http.get("served_model_name") or "tidal",
            model_folder=model,
            api_key=key,
        )


async def close_tasks(tasks: list[Task]) -> None:
    for task in tasks:
        if isinstance(task, VerifiersTask):
            await task.aclose()
