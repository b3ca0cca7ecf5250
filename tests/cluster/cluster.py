"""A SLURM cluster of containers for `make test-cluster`: image, network, nodes, jobs.

One image (deploy/docker/slurm-node.Dockerfile, on the offline base of deploy/base-image.sh)
runs as a controller (munged + slurmctld) and three compute nodes (munged + slurmd), each a
container with its own hostname on one Docker network. Every node mounts the same two host
folders: `conf/` read-only at /cluster-conf (deploy/slurm/slurm.conf and the one munge key)
and `shared/` at /shared (the cluster filesystem the run folders live on); the repo's
configs/ is at /tidal/configs. Only what this module creates is removed: containers and
the network by their prefixed names; the image stays as the build cache (a rebuild removes
the image it replaced).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.deploy.engine import sh

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TIDAL_CLUSTER_IMAGE", "tidal-slurm-node:latest")
BASE_IMAGE = os.environ.get("BASE_IMAGE", "tidal-base:bookworm")
PREFIX = "tidalcluster"
CONTROLLER = "controller"
COMPUTE = ("node1", "node2", "node3")
WORKDIR = "/tidal"
SACCT_FIELDS = "JobID,State,ExitCode,NodeList"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def build_image(work: Path, log: Path) -> None:
    """The offline base, then the node image from a context of hard links to dist/ (the
    repo's wheels and wheelhouse: `make wheelhouse`) and deploy/slurm/."""
    sh([str(ROOT / "deploy" / "base-image.sh")], log=log, timeout=1800)
    context = work / "context"
    shutil.rmtree(context, ignore_errors=True)
    (context / "deploy").mkdir(parents=True)
    shutil.copytree(ROOT / "dist", context / "dist", copy_function=os.link)
    shutil.copytree(ROOT / "deploy" / "slurm", context / "deploy" / "slurm")
    dockerfile = ROOT / "deploy" / "docker" / "slurm-node.Dockerfile"
    before = _image_id(IMAGE)
    sh(
        ["docker", "build", "-t", IMAGE, "-f", str(dockerfile),
         "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", str(context)],
        log=log, timeout=3600,
    )  # fmt: skip
    shutil.rmtree(context)
    if before and before != _image_id(IMAGE):  # the image this build replaced, untagged now
        sh(["docker", "image", "rm", before], check=False, log=log)


def _image_id(image: str) -> str:
    found = sh(["docker", "image", "inspect", "--format", "{{.Id}}", image], check=False)
    return found.stdout.strip() if found.returncode == 0 else ""


@dataclass
class Cluster:
    work: Path
    log: Path

    @property
    def shared(self) -> Path:
        return self.work / "shared"

    def name(self, host: str) -> str:
        return f"{PREFIX}-{host}"

    def start(self) -> None:
        self.remove()  # a previous run's leftovers, by name
        conf = self.work / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        self.shared.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "deploy" / "slurm" / "slurm.conf", conf / "slurm.conf")
        key = conf / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sh(["docker", "network", "create", PREFIX], log=self.log)
        for host in (CONTROLLER, *COMPUTE):
            self.run_node(host)
        self.wait_idle(len(COMPUTE))

    def run_node(self, host: str) -> None:
        role = "controller" if host == CONTROLLER else "compute"
        sh(
            ["docker", "run", "-d", "--init", "--name", self.name(host), "--hostname", host,
             "--network", PREFIX, "--network-alias", host,
             "-v", f"{self.work / 'conf'}:/cluster-conf:ro",
             "-v", f"{self.shared}:/shared",
             "-v", f"{ROOT / 'configs'}:{WORKDIR}/configs:ro",
             "-w", WORKDIR, IMAGE, role],
            log=self.log,
        )  # fmt: skip

    def exec(
        self, host: str, *argv: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return sh(["docker", "exec", self.name(host), *argv], timeout=timeout, check=check)

    def node_states(self) -> dict[str, str]:
        out = self.exec(CONTROLLER, "sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if sum(s == "idle" for s in states.values()) >= count:
                return
            time.sleep(1)
        raise AssertionError(f"{count} idle nodes never came: {self.node_states()}\n{self.logs()}")

    def submit(self, *args: str) -> str:
        """`tidal rl ARGS` on the controller; the job id sbatch answered."""
        done = self.exec(CONTROLLER, "tidal", "rl", *args, timeout=300)
        found = re.search(r"Submitted batch job (\d+)", done.stdout)
        assert found, done.stdout
        return found.group(1)

    def job(self, job_id: str) -> dict[str, str]:
        out = self.exec(CONTROLLER, "scontrol", "show", "job", job_id, check=False).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def completions(self, job_id: str, count: int = 1, timeout: float = 30) -> list[dict[str, str]]:
        """`sacct --completion` on the controller: the job's records in the job-completion
        log (jobcomp/filetxt), one per time it ended, oldest first. Waits up to `timeout`
        for `count` records: slurmctld writes one as the job leaves the running state."""
        argv = ("sacct", "--completion", "-j", job_id, "-n", "-P", "-o", SACCT_FIELDS)
        deadline = time.monotonic() + timeout
        while True:
            out = self.exec(CONTROLLER, *argv).stdout
            names = SACCT_FIELDS.split(",")
            rows = [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines()]
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(1)

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in FINISHED:
                return fields
            time.sleep(2)
        return self.job(job_id)

    def logs(self) -> str:
        parts = []
        for host in (CONTROLLER, *COMPUTE):
            daemon = "slurmctld" if host == CONTROLLER else "slurmd"
            out = sh(
                ["docker", "exec", self.name(host), "tail", "-n", "30",
                 f"/var/log/slurm/{daemon}.log"],
                check=False,
            )  # fmt: skip
            parts.append(f"--- {host} {daemon}.log\n{out.stdout}{out.stderr}")
        return "\n".join(parts)

    def remove(self) -> None:
        for host in (CONTROLLER, *COMPUTE):
            sh(["docker", "rm", "-f", "-v", self.name(host)], check=False)
        sh(["docker", "network", "rm", PREFIX], check=False)


def span_medians(run_dir: Path, names: tuple[str, ...]) -> dict[str, float]:
    """Median seconds of each named span in the run's traces.jsonl (the run's timings)."""
    found: dict[str, list[float]] = {}
    for line in (run_dir / "traces.jsonl").read_text().splitlines():
        span = json.loads(line)
        if span["name"] in names:
            start, end = (datetime.fromisoformat(span[k]) for k in ("start_time", "end_time"))
            found.setdefault(span["name"], []).append((end - start).total_seconds())
    return {name: statistics.median(times) for name, times in found.items()}
