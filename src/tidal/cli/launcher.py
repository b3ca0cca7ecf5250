"""`tidal rl`: run the four services as child processes on loopback and supervise them.

Decisions:
- The full run config is validated here before any child starts, then written resolved
  (free loopback ports filled in) to `<run dir>/config.toml`; every child reads that one
  file, so the run is reproducible from its output folder.
- Children start in their own sessions (process groups): a Ctrl-C reaches the launcher
  only, which then stops every child in order with SIGTERM (graceful gRPC shutdown) and
  SIGKILL after a grace period, so nothing is left running.
- A launcher that is itself killed (SIGKILL, the OOM killer) cannot do that, so every
  child also dies with it on its own (tidal.common.lifeline): on Linux by a parent-death
  signal (PR_SET_PDEATHSIG = SIGTERM, set between fork and exec, so the kernel delivers
  it however the launcher dies, and the child still shuts down gracefully), and on every
  OS by a watchdog thread in each service watching the launcher's pid
  (`TIDAL_LAUNCHER_PID`), which also covers torchrun ranks and kills a child whose
  graceful shutdown hangs. Children are forked from the main thread, because
  PDEATHSIG follows the forking thread, not the process.
- Each child's stdout and stderr go to `<run dir>/logs/<service>.log`; the orchestrator's
  output is also echoed to the terminal, since it reports the run's progress.
- `[deployment]` places inference, then the trainer, on the visible GPUs (each child
  gets its CUDA_VISIBLE_DEVICES; placement.py); `[slurm]` writes (and submits) an sbatch
  script instead of running anything here (slurm.py).
- An existing run folder is never replaced silently: `--overwrite` deletes it first
  (only ever a folder strictly inside `run.output_dir`: `tidal.common.removal`, and
  `run.name` is a plain name), `--resume` continues it (keeps its progress, checkpoints,
  weights and logs; the trainer gets `--resume`, the orchestrator
  `--orchestrator.resume true`), and neither is an error naming both. Resuming needs a
  complete trainer checkpoint (`trainer.ckpt.interval` > 0 when the run was started):
  without one the launcher refuses before starting anything, rather than letting the
  run start over under the old run's published versions.
- Which children run is children.py's: with `inference.replicas = N`, N inference
  processes, each on its own free loopback port (listed in
  `endpoints.inference_replicas`, which the orchestrator reads).
- The run ends when the orchestrator exits. Any child exiting earlier, or the
  orchestrator exiting non-zero, fails the run: the launcher exits 1 and shows that
  child's exit reason and last log lines. The exception: an inference replica dying
  while another replica still runs (children.survivable_loss); the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from tidal.cli.children import START_ORDER, child_specs, survivable_loss
from tidal.cli.config import LAUNCHER_SECTIONS, RunConfig
from tidal.cli.placement import place, trainer_world_size, visible_gpus
from tidal.cli.slurm import SlurmConfig, submit, write_job
from tidal.common.config import load_or_exit, to_toml
from tidal.common.errors import ConfigError
from tidal.common.lifeline import launcher_env, parent_death_signal
from tidal.common.removal import remove_inside
from tidal.trainer.parallel.config import check_parallel

ECHOED = {"orchestrator"}
TAIL_LINES = 30
KILL_AFTER_S = 10.0
OVERWRITE, RESUME = "--overwrite", "--resume"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prepare_run_dir(config: RunConfig, *, overwrite: bool = False, resume: bool = False) -> Path:
    """Create (or, resuming, reuse) the run folder, give every service a free loopback
    port and write the resolved config (with the OpenAI endpoint's port, when
    `[inference.http]` is enabled and asks for any). Raises ConfigError for an existing folder
    without `overwrite` or `resume`, and for `resume` without anything to resume."""
    run_dir = config.run.dir
    if overwrite and resume:
        raise ConfigError(f"{OVERWRITE} and {RESUME} exclude each other: choose one")
    if run_dir.exists() and not (overwrite or resume):
        raise ConfigError(
            f"run folder {run_dir} already exists (run.name = {config.run.name!r}): pass "
            f"{RESUME} to continue that run, {OVERWRITE} to delete it and start afresh, or "
            "choose another --run.name"
        )
    if resume:
        check_resumable(config)
    elif run_dir.exists():
        print(f"tidal: {OVERWRITE}: deleting previous outputs in {run_dir}", file=sys.stderr)
        remove_inside(run_dir, config.run.output_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=resume)
    for name in START_ORDER:
        setattr(config.endpoints, name, f"127.0.0.1:{free_port()}")
    replicas = config.inference.replicas
    config.endpoints.inference_replicas = (
        [config.endpoints.inference] + [f"127.0.0.1:{free_port()}" for _ in range(replicas - 1)]
        if replicas > 1
        else []
    )
    http = config.inference.http
    if http.enabled:
        # A fixed port in config.toml is how a harness finds the OpenAI endpoint of a run;
        # replica i serves on that port + i (children.py).
        if http.port == 0:
            http.port = free_port()
        for i in range(replicas):
            url = http.url(http.port + i)
            which = f"replica {i}'s" if replicas > 1 else "inference's"
            print(f"tidal: {which} OpenAI-compatible endpoint: {url}", file=sys.stderr)
    (run_dir / "config.toml").write_text(services_toml(config))
    return run_dir


def check_resumable(config: RunConfig) -> None:
    """`--resume` needs the run folder and a complete trainer checkpoint in it (the
    `step_*/.metadata` layout of tidal.trainer.checkpoint, read here without torch)."""
    run_dir = config.run.dir
    if not run_dir.is_dir():
        raise ConfigError(f"{RESUME}: there is no run folder {run_dir} to continue")
    ckpt_dir = config.trainer.ckpt.dir or run_dir / "checkpoints"
    if not any(ckpt_dir.glob("step_*/.metadata")):
        raise ConfigError(
            f"{RESUME}: {run_dir} holds no complete trainer checkpoint in {ckpt_dir}, so the "
            "trainer cannot continue it (the run was started with trainer.ckpt.interval = 0, "
            f"or stopped before its first checkpoint). Start it again with {OVERWRITE}, and "
            "set trainer.ckpt.interval to make a run resumable"
        )


def services_toml(config: RunConfig) -> str:
    """The resolved config the services read (without the launcher's own sections)."""
    return tomli_w.dumps(
        config.model_dump(mode="json", exclude_none=True, exclude=LAUNCHER_SECTIONS)
    )


def apply_placement(config: RunConfig, gpus: list[str]) -> dict[str, dict[str, str]]:
    """Apply `[deployment]` (or `[slurm]`) to the trainer and inference sections; the
    extra environment of each child. Raises ConfigError naming the fields."""
    explicit = "world_size" in config.trainer.model_fields_set
    if config.slurm is not None:
        world = trainer_world_size(
            config.slurm.world_size,
            config.trainer.world_size,
            explicit=explicit,
            source="slurm.trainer_nodes × gpus_per_node",
        )
        config.trainer.world_size = world
        if config.slurm.gpus_per_node:
            config.trainer.device = config.inference.device = "cuda"
        check_parallel(world, config.trainer.parallel, config.trainer.model, config.trainer.loss)
        return {}
    devices = place(config.deployment, gpus)
    config.trainer.world_size = trainer_world_size(
        config.deployment.num_train_gpus, config.trainer.world_size, explicit=explicit
    )
    if config.deployment.num_infer_gpus:
        config.inference.device = "cuda"
        if config.deployment.num_infer_gpus % config.inference.replicas:
            raise ConfigError(
                f"deployment.num_infer_gpus = {config.deployment.num_infer_gpus} cannot be "
                f"split evenly over inference.replicas = {config.inference.replicas}: make "
                "it a multiple of the replica count"
            )
    if config.deployment.num_train_gpus:
        config.trainer.device = "cuda"
    t = config.trainer
    check_parallel(t.world_size, t.parallel, t.model, t.loss)
    return {name: {"CUDA_VISIBLE_DEVICES": ids} for name, ids in devices.items()}


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    async def pump(self, echo: bool) -> None:
        """Copy the child's output to its log file (and the terminal), keeping a tail."""
        assert self.process.stdout is not None
        with self.log_path.open("ab") as log:
            async for raw in self.process.stdout:
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                self.tail.append(line)
                if echo:
                    print(line, flush=True)

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)


async def start_child(
    name: str,
    config_path: Path,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    *,
    service: str | None = None,
) -> Child:
    """Start `tidal.<service>` (default: `name`) as child `name`, logging to `<name>.log`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **launcher_env(), **(extra_env or {})}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        f"tidal.{service or name}",
        "@",
        str(config_path),
        *extra_args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=parent_death_signal(),
    )
    return Child(name, process, log_dir / f"{name}.log")


async def stop_all(children: Sequence[Child]) -> None:
    """SIGTERM everyone still running (reverse start order), SIGKILL after a grace period."""
    running = [c for c in reversed(children) if c.process.returncode is None]
    for child in running:
        child.signal(signal.SIGTERM)
    waits = [asyncio.create_task(c.process.wait()) for c in running]
    if not waits:
        return
    _, pending = await asyncio.wait(waits, timeout=KILL_AFTER_S)
    for child in running:
        if child.process.returncode is None:
            child.signal(signal.SIGKILL)
    if pending:
        await asyncio.wait(pending)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


async def supervise(
    run_dir: Path, envs: dict[str, dict[str, str]] | None = None, *, resume: bool = False
) -> int:
    children: list[Child] = []
    pumps: list[asyncio.Task[None]] = []
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted.set)
    try:
        for spec in child_specs(run_dir, envs, resume=resume):
            child = await start_child(
                spec.name,
                run_dir / "config.toml",
                run_dir / "logs",
                spec.env,
                spec.args,
                service=spec.service,
            )
            children.append(child)
            pumps.append(asyncio.create_task(child.pump(echo=spec.name in ECHOED)))
        exits = {asyncio.create_task(c.process.wait()): c for c in children}
        stop = asyncio.create_task(interrupted.wait())
        while True:
            done, _ = await asyncio.wait([*exits, stop], return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                print("tidal: interrupted, stopping all services", file=sys.stderr)
                return 130
            first = exits.pop(next(t for t in done if t in exits))
            if not survivable_loss(first.name, (c.name for c in exits.values())):
                break
            print(
                f"tidal: {first.name} {describe_exit(first.process.returncode or 0)}; the "
                "other inference replicas go on serving",
                file=sys.stderr,
            )
        await asyncio.wait(pumps, timeout=2)  # let its last lines reach the tail
        code = first.process.returncode or 0
        if first.name == "orchestrator" and code == 0:
            print(f"tidal: run finished; outputs in {run_dir}")
            return 0
        print(
            f"tidal: {first.name} {describe_exit(code)}; its last log lines "
            f"({first.log_path}):\n" + "\n".join(f"  | {line}" for line in first.tail),
            file=sys.stderr,
        )
        return 1
    finally:
        await stop_all(children)
        for pump in pumps:
            pump.cancel()


def run_slurm(config: RunConfig, slurm: SlurmConfig, *, dry_run: bool) -> None:
    script = write_job(config, slurm, services_toml(config))
    print(f"tidal: wrote {script} and {script.parent / 'config.toml'}")
    if not dry_run:
        print(f"tidal: {submit(script)}")


def main(argv: Sequence[str]) -> None:
    flags = {"--dry-run", OVERWRITE, RESUME}
    dry_run, overwrite, resume = ("--dry-run" in argv, OVERWRITE in argv, RESUME in argv)
    config = load_or_exit(
        RunConfig,
        [a for a in argv if a not in flags],
        usage=f"tidal rl @ config.toml [--section.key value ...] [{OVERWRITE} | {RESUME}]",
    )
    try:
        envs = apply_placement(config, visible_gpus())
        if config.slurm is not None:
            run_slurm(config, config.slurm, dry_run=dry_run)
            raise SystemExit(0)
        if dry_run:
            print(to_toml(config), end="")
            raise SystemExit(0)
        run_dir = prepare_run_dir(config, overwrite=overwrite, resume=resume)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(asyncio.run(supervise(run_dir, envs, resume=resume)))
