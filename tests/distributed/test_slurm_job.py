"""`tidal rl` with `[slurm]` submits its rendered sbatch script to a real single-node
SLURM cluster started by the test; the whole run (all four services) completes there.

The cluster (munged, slurmctld, slurmd) lives in a temp folder on free ports with its own
munge key and socket, so it touches no system configuration; the daemons are stopped by
their pid files afterwards. It needs Debian's SLURM daemons and munge, and root (the daemons
run as SlurmUser root): as root, deploy/slurm/install-packages.sh installs the packages
when missing (`make test` runs it once in its setup); otherwise the test is skipped with
the reason."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidal.cli.ports import bindable, ephemeral_range, free_port
from tidal.common.observability.prometheus import MetricsConfig

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
INSTALL = ROOT / "deploy" / "slurm" / "install-packages.sh"


def _absent() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]


def missing_reason() -> str | None:
    """Why no cluster can be started here (after installing the packages as root), or None."""
    if os.geteuid() != 0:
        return "slurmctld/slurmd run here as SlurmUser root, and this test is not root"
    if _absent():
        subprocess.run([str(INSTALL)], capture_output=True, timeout=600)
    absent = _absent()
    if absent:
        return f"slurm/munge not installed ({', '.join(absent)}) and {INSTALL.name} failed"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


CONF = """ClusterName=tidaltest
SlurmctldHost={host}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


@dataclass
class SlurmCluster:
    root: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    @classmethod
    def start(cls, root: Path) -> SlurmCluster:
        for sub in ("state", "spool"):
            (root / sub).mkdir(parents=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        subprocess.run(
            [_exe("munged"), "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
             f"--log-file={root}/munged.log", f"--pid-file={root}/munged.pid",
             f"--seed-file={root}/munged.seed"],
            check=True,
        )  # fmt: skip
        host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
        (root / "slurm.conf").write_text(
            CONF.format(
                host=host,
                root=root,
                ctld_port=free_port(),
                d_port=free_port(),
                cpus=os.cpu_count() or 1,
            )
        )
        cluster = cls(root)
        conf = str(root / "slurm.conf")
        subprocess.run([_exe("slurmctld"), "-f", conf], check=True, env=cluster.env)
        subprocess.run([_exe("slurmd"), "-f", conf], check=True, env=cluster.env)
        cluster.wait_idle()
        return cluster

    def wait_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env
            ).stdout
            if out.strip() == "idle":
                return
            time.sleep(0.5)
        raise AssertionError(f"the test cluster's node never became idle:\n{self.logs()}")

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(JobState, ExitCode) of a job, from scontrol."""
        out = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, env=self.env
        ).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "")

    def wait_job(self, job_id: str, timeout: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state[0] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state
            time.sleep(1)
        return self.job_state(job_id)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.root.glob("*.log"))
        )

    def cancel_jobs(self, timeout: float = 30) -> None:
        """Cancel every job and wait until none is left: slurmstepd and the job's
        processes would outlive the daemons."""
        subprocess.run(["scancel", "--partition", "debug"], env=self.env, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=self.env
            ).stdout
            if not out.strip():
                return
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel the jobs, SIGTERM the daemons and wait (up to 10 s) until they are gone."""
        self.cancel_jobs()
        pids = []
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.root / f"{name}.pid"
            if pid_file.is_file():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    pids.append(int(pid_file.read_text().split()[0]))
                    os.kill(pids[-1], signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in pids):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)


@pytest.fixture
def cluster() -> Iterator[SlurmCluster]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    # A short folder of its own, not tmp_path: slurmstepd's unix socket paths under the
    # spool folder must stay within 108 bytes whatever TMPDIR and the test's name are.
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    started = SlurmCluster.start(root)
    yield started
    started.stop()
    shutil.rmtree(root, ignore_errors=True)


def job_ports() -> dict[str, int]:
    """A port per service and for the trainer's rendezvous, each free with its metrics
    port, both below the ephemeral range. The defaults (50051-50054, metrics 51051-51054)
    lie inside it on Linux, where another test's outgoing connection may hold one of them
    for as long as it lives."""
    names = ("orchestrator", "inference", "trainer", "weightsync", "rdzv")
    offset = MetricsConfig().port_offset
    ports: list[int] = []
    taken: set[int] = set()
    while len(ports) < len(names):
        port = free_port()
        metrics = port + offset
        if {port, metrics} & taken or metrics >= ephemeral_range()[0] or not bindable(metrics):
            continue
        ports.append(port)
        taken |= {port, metrics}
    return dict(zip(names, ports, strict=True))


def test_tidal_rl_job_completes_on_a_real_slurm_cluster(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    ports = job_ports()
    endpoints = [
        arg
        for name in ("orchestrator", "inference", "trainer", "weightsync")
        for arg in (f"--endpoints.{name}", f"127.0.0.1:{ports[name]}")
    ]
    submitted = subprocess.run(
        [
            sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
            "--run.output-dir", str(tmp_path / "out"), "--run.name", "job",
            "--slurm.inference-nodes", "0", "--slurm.time", "00:05:00",
            "--slurm.rdzv-port", str(ports["rdzv"]), *endpoints,
            "--orchestrator.steps", "3", "--orchestrator.warmup-steps", "1",
        ],
        capture_output=True, text=True, timeout=60, env=cluster.env, cwd=tmp_path,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"Submitted batch job (\d+)", submitted.stdout)
    assert job_id, submitted.stdout
    state, exit_code = cluster.wait_job(job_id.group(1), timeout=240)
    logs = tmp_path / "out" / "job" / "logs"
    detail = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in logs.glob("*"))
    assert (state, exit_code) == ("COMPLETED", "0:0"), f"{detail}\n{cluster.logs()}"
    assert "run finished: 4 steps" in (logs / "orchestrator.log").read_text()
    assert "trained step 4 " in (logs / "trainer.log").read_text()
