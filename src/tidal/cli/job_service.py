"""One service of a SLURM job, supervised on its node as `tidal rl` supervises its children.

    python -m tidal.cli.job_service --run-dir DIR [--resume] NAME MODULE [ARGS ...]

runs `python -m MODULE @ DIR/config.toml ARGS` (ARGS: the job's endpoint and security
flags) and restarts it after a crash with the launcher's own Supervisor: the backoff and
budget of `[supervision]` in `DIR/launch.toml`, the continue arguments of a restart
(`RESUME_ARGS`), the log `DIR/logs/NAME.log`, the record `DIR/supervision-NAME.json`
(one per service: the services of a job run on different nodes). A clean exit (0) ends
it; SIGTERM (the job's end) stops the service. `--resume` gives the first start the
continue arguments too: the job was requeued and the run continues.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from tidal.cli.supervision import RESUME_ARGS, ChildSpec, SupervisionConfig, Supervisor


def supervision_config(run_dir: Path) -> SupervisionConfig:
    """`[supervision]` of the job's launch config (the defaults where it has none)."""
    launch = run_dir / "launch.toml"
    section = tomllib.loads(launch.read_text()).get("supervision", {}) if launch.is_file() else {}
    return SupervisionConfig.model_validate(section)


def service_spec(name: str, module: str, args: Sequence[str], *, resume: bool) -> ChildSpec:
    cont = tuple(RESUME_ARGS.get(module.removeprefix("tidal."), ()))
    return ChildSpec(
        name=name,
        module=module,
        args=(*args, *cont) if resume else tuple(args),
        restart_args=(*args, *cont),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidal.cli.job_service")
    parser.add_argument("--run-dir", type=Path, required=True, help="the job's run folder")
    parser.add_argument("--resume", action="store_true", help="continue from the first start")
    parser.add_argument("name", help="the service's name in logs/ and its supervision record")
    parser.add_argument("module", help="the service's module, e.g. tidal.inference")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the service's own arguments")
    ns = parser.parse_args(argv)
    run_dir = ns.run_dir.resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    spec = service_spec(ns.name, ns.module, ns.args, resume=ns.resume)
    supervisor = Supervisor(
        run_dir,
        [spec],
        supervision_config(run_dir),
        finisher=ns.name,
        record=f"supervision-{ns.name}.json",
    )
    return asyncio.run(supervisor.run())


if __name__ == "__main__":
    sys.exit(main())
