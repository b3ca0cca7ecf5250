"""Docker engine and compose plumbing for `make test-deploy` (tests/deploy/).

Design: the deploy test must run on a bare CI machine of this project (Debian, root, no
engine, no registry reachable), so when no engine answers it installs Debian's
`docker.io` (plus `debootstrap` for the base image and `docker-compose` when no compose v2
plugin exists) with apt-get and starts `dockerd` itself, in the background, logging to a
file. An engine it finds running is used as it is, and one it started is left running
(a second run needs no start-up; `kill $(cat /run/tidal-dockerd.pid)` stops it).
Every command is a subprocess with a timeout; failures raise with the command's output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

DOCKERD_LOG = Path("/var/log/tidal-dockerd.log")
DOCKERD_PID = Path("/run/tidal-dockerd.pid")


class CommandFailed(RuntimeError):
    pass


def sh(
    argv: Sequence[str],
    *,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    check: bool = True,
    log: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv`; its output goes to `log` (appended) when given, else is captured."""
    if log is not None:
        with log.open("a") as out:
            out.write(f"\n$ {' '.join(argv)}\n")
            out.flush()
            proc = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env
            )
        tail = "\n".join(log.read_text().splitlines()[-40:])
        result = subprocess.CompletedProcess(argv, proc.returncode, tail, "")
    else:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise CommandFailed(
            f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) where it exists, else Debian's `docker-compose` (v1)."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def _apt_install(packages: list[str], log: Path) -> None:
    if os.geteuid() != 0:
        raise CommandFailed(f"need root to apt-get install {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sh(["apt-get", "update", "-q"], env=env, log=log, timeout=600)
    sh(["apt-get", "install", "-y", "-q", *packages], env=env, log=log, timeout=1200)


def ensure_engine(log: Path) -> str:
    """Make sure an engine answers and compose and debootstrap exist; say what was done."""
    missing = []
    if shutil.which("dockerd") is None and not engine_answers():
        missing.append("docker.io")
    if shutil.which("debootstrap") is None:
        missing.append("debootstrap")
    if compose_command() is None:
        missing.append("docker-compose")
    done = []
    if missing:
        _apt_install(missing, log)
        done.append(f"installed {', '.join(missing)}")
    if not engine_answers():
        DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
        with DOCKERD_LOG.open("a") as out:
            proc = subprocess.Popen(
                ["dockerd"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        DOCKERD_PID.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + 90
        while not engine_answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CommandFailed(f"dockerd did not come up; see {DOCKERD_LOG}")
            time.sleep(1)
        done.append(f"started dockerd (pid {proc.pid}, log {DOCKERD_LOG})")
    return "; ".join(done) or "engine already running"


def container_state(container_id: str) -> dict:  # type: ignore[type-arg]
    out = sh(["docker", "inspect", "--format", "{{json .State}}", container_id]).stdout
    return json.loads(out)


def image_size_mb(image: str) -> float:
    out = sh(["docker", "image", "inspect", "--format", "{{.Size}}", image]).stdout
    return int(out.strip()) / 1e6
