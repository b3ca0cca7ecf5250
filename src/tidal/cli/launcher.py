"""`tidal rl`: run the four services as child processes on loopback and supervise them.

The run config is validated before any child starts and written resolved (free ports
filled in) to `<run dir>/config.toml`, which every child reads. Children run in their own
sessions and die with the launcher however it dies (`launcher_watch`); an existing run
folder needs `--overwrite` or `--resume` (docs/operations.md, "Supervision and restarts").
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import tomli_w

from tidal.cli.certs import ensure_run_credentials
from tidal.cli.config import LAUNCHER_SECTIONS, RunConfig
from tidal.cli.inference_replicas import inference_replicas
from tidal.cli.judge_replicas import assign_judge_urls, judge_replicas, served_judges
from tidal.cli.metrics_targets import with_metrics_ports
from tidal.cli.placement import place, trainer_world_size, visible_gpus
from tidal.cli.ports import free_port
from tidal.cli.run_timing import finish_summary, launch_env, print_final_summary, process_start_time
from tidal.cli.slurm import SlurmConfig, ephemeral_ports_note, submit, write_job
from tidal.cli.supervision import RESUME_ARGS, ChildSpec, Supervisor
from tidal.cli.teacher_replica import assign_teacher_address, teacher_replicas
from tidal.cli.trainer_resume import resume_point
from tidal.common.config.loading import load_or_exit, to_toml
from tidal.common.errors import ConfigError
from tidal.common.files.modes import apply_file_policy
from tidal.common.files.safe_remove import remove_inside
from tidal.orchestrator.records.wandb_sink import import_wandb
from tidal.trainer.parallel_config import check_parallel

# Start order: publishers before subscribers; clients wait for their servers anyway.
START_ORDER = ("weightsync", "trainer", "inference", "orchestrator")
OVERWRITE, RESUME = "--overwrite", "--resume"


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
    run_dir.mkdir(parents=True, exist_ok=True)  # as the file policy says, before tls/ in it
    # --- transport security: the run's CA and per-role certificates (reused on resume) ---
    created = ensure_run_credentials(config)
    if created:
        where = config.security.folder(run_dir)
        print(f"tidal: created TLS credentials in {where}: {', '.join(created)}", file=sys.stderr)
    # --- end transport security ---
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
        # replica i serves on that port + i (inference_replicas.py).
        if http.port == 0:
            http.port = free_port()
        for i in range(replicas):
            url = http.url(http.port + i)
            which = f"replica {i}'s" if replicas > 1 else "inference's"
            print(f"tidal: {which} OpenAI-compatible endpoint: {url}", file=sys.stderr)
    for folder, url in assign_judge_urls(config).items():
        print(f"tidal: judge {folder} served at {url}", file=sys.stderr)
    if (teacher := assign_teacher_address(config)) is not None:
        folder = config.orchestrator.distill.model_path
        print(f"tidal: distillation teacher {folder} served at {teacher}", file=sys.stderr)
    (run_dir / "config.toml").write_text(services_toml(config))
    return run_dir


def trainer_dirs(config: RunConfig) -> tuple[Path, Path]:
    """The trainer's checkpoint folder and the folder its versions are published to."""
    run_dir = config.run.dir
    return (
        config.trainer.ckpt.dir or run_dir / "checkpoints",
        config.trainer.publish_dir or run_dir / "weights",
    )


def check_resumable(config: RunConfig) -> None:
    """`--resume` needs the run folder, a trained step to continue from (a checkpoint or
    the step journal from step 1), and no published version beyond it."""
    run_dir = config.run.dir
    if not run_dir.is_dir():
        raise ConfigError(f"{RESUME}: there is no run folder {run_dir} to continue")
    ckpt_dir, weights_dir = trainer_dirs(config)
    point = resume_point(ckpt_dir, weights_dir)
    refusal = point.refusal(ckpt_dir, weights_dir)
    if refusal:
        raise ConfigError(
            f"{RESUME}: the trainer cannot continue {run_dir}: {refusal}. Start it again "
            f"with {OVERWRITE}"
        )
    if not point.reached:
        raise ConfigError(
            f"{RESUME}: {run_dir} holds no complete trainer checkpoint in {ckpt_dir} and no "
            "journaled step, so there is nothing to continue (the run stopped before its "
            f"first step, or was started with trainer.ckpt.interval = 0). Start it again with "
            f"{OVERWRITE}"
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


def child_specs(
    config: RunConfig, envs: dict[str, dict[str, str]] | None = None, *, resume: bool = False
) -> list[ChildSpec]:
    """The run's service processes in start order: what each is told on its first start
    (`--resume`: continue) and on a restart (always continue), and when it cannot be."""
    specs = []
    for name in START_ORDER:
        cont = tuple(RESUME_ARGS.get(name, []))
        if name == "inference":  # one child per replica (judge, teacher), the same on a restart
            env = (envs or {}).get(name, {})
            specs += [
                ChildSpec(r.name, "tidal.inference", r.args, r.args, r.env, always_restartable)
                for r in (
                    inference_replicas(config, env)
                    + judge_replicas(config, env)
                    + teacher_replicas(config, env)
                )
            ]
            continue
        specs.append(
            ChildSpec(
                name=name,
                module=f"tidal.{name}",
                args=cont if resume else (),
                restart_args=cont,
                env=(envs or {}).get(name, {}),
                can_restart=partial(trainer_cannot_resume, config)
                if name == "trainer"
                else always_restartable,
            )
        )
    return specs


def always_restartable() -> str | None:
    return None


def trainer_cannot_resume(config: RunConfig) -> str | None:
    """Why a restarted trainer could not continue the run (None: it can): it resumes from
    its newest checkpoint (or its initial weights) and replays the journal after it, and
    refuses to continue under a published version it cannot reach."""
    ckpt_dir, weights_dir = trainer_dirs(config)
    refusal = resume_point(ckpt_dir, weights_dir).refusal(ckpt_dir, weights_dir)
    return f"a restarted trainer cannot continue the run: {refusal}" if refusal else None


def run_ports(config: RunConfig) -> set[int]:
    """The loopback ports `prepare_run_dir` gave the services (gRPC and OpenAI HTTP)."""
    e = config.endpoints
    addresses = [e.orchestrator, e.inference, e.trainer, e.weightsync, *e.inference_replicas]
    ports = {int(a.rsplit(":", 1)[1]) for a in addresses}
    if config.inference.http.enabled:
        ports |= {config.inference.http.port + i for i in range(config.inference.replicas)}
    return ports


async def supervise(
    config: RunConfig,
    envs: dict[str, dict[str, str]] | None = None,
    *,
    resume: bool = False,
    launched_at: float | None = None,
) -> int:
    """Run the children to the end; after a finished run, print the summary table with
    its start-up and shutdown seconds (run_timing.py)."""
    launched_at = process_start_time() if launched_at is None else launched_at
    specs = [
        replace(spec, env={**spec.env, **launch_env(launched_at)})
        for spec in child_specs(config, envs, resume=resume)
    ]
    if config.metrics.enabled:
        specs = with_metrics_ports(
            specs, config.run.dir, config.run.name, free_port, taken=run_ports(config)
        )
    code = await Supervisor(config.run.dir, specs, config.supervision).run()
    summary = finish_summary(config.run.dir, launched_at) if code == 0 else None
    if summary is not None:
        print_final_summary(summary)
    return code


def run_slurm(config: RunConfig, slurm: SlurmConfig, *, dry_run: bool) -> None:
    script = write_job(config, slurm, services_toml(config))
    print(f"tidal: wrote {script} and {script.parent / 'config.toml'}")
    note = ephemeral_ports_note(config.endpoints, config.metrics, slurm)
    if note is not None:
        print(f"tidal: note: {note}", file=sys.stderr)
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
    apply_file_policy(shared_readable=config.run.shared_readable)  # children inherit it
    try:
        if config.orchestrator.wandb.enabled:
            import_wandb()  # fail before anything starts when the extra is missing
        envs = apply_placement(config, visible_gpus())
        if config.slurm is not None and config.orchestrator.distill.model_path is not None:
            raise ConfigError(
                "a SLURM job does not start a distillation teacher: serve it yourself and set "
                "orchestrator.distill.address instead of model_path"
            )
        if config.slurm is not None and served_judges(config):
            raise ConfigError(
                "a SLURM job does not start judge replicas: serve the judge yourself and set "
                "the judge's base_url instead of model_path"
            )
        if config.slurm is not None:
            run_slurm(config, config.slurm, dry_run=dry_run)
            raise SystemExit(0)
        if dry_run:
            print(to_toml(config), end="")
            raise SystemExit(0)
        prepare_run_dir(config, overwrite=overwrite, resume=resume)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(asyncio.run(supervise(config, envs, resume=resume)))
