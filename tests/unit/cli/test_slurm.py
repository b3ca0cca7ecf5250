"""`tidal rl` with `[slurm]`: --dry-run writes the rendered sbatch script and the resolved
config; the script wires nodes, ports and the trainer's rendezvous."""

from __future__ import annotations

import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tidal.cli import ports
from tidal.cli.slurm import SlurmConfig, ephemeral_ports_note, render
from tidal.common.config.shared import Endpoints
from tidal.common.errors import ConfigError
from tidal.common.observability.prometheus import MetricsConfig

ROOT = Path(__file__).resolve().parents[3]


def dry_run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
            "--run.output-dir", str(tmp_path), "--run.name", "job", *flags, "--dry-run",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_dry_run_writes_the_script_and_the_resolved_config(tmp_path: Path) -> None:
    done = dry_run(
        tmp_path,
        "--slurm.trainer-nodes", "2", "--slurm.gpus-per-node", "4",
        "--slurm.partition", "gpu", "--slurm.extra-sbatch", '["--exclusive"]',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    low, high = ports.ephemeral_range()
    assert ("tidal: note: these ports" in done.stderr) == (low <= 50051 <= high), done.stderr
    script = (tmp_path / "job" / "tidal.sbatch").read_text()
    config = tomllib.loads((tmp_path / "job" / "config.toml").read_text())
    assert "slurm" not in config and "deployment" not in config  # the launcher's own
    assert config["trainer"]["world_size"] == 8 and config["trainer"]["device"] == "cuda"
    assert tomllib.loads((tmp_path / "job" / "launch.toml").read_text())["slurm"]["partition"]
    for line in (
        "#SBATCH --nodes=3",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --exclusive",
        f"CONFIG={tmp_path / 'job' / 'config.toml'}",
        "INFER_NODE=${NODES[2]}",
        '--endpoints.trainer "$HEAD:50053"',
        '--endpoints.inference "$INFER_NODE:50052"',
        "--nnodes=2",
        "--nproc-per-node=4",
        '--node-rank="$SLURM_NODEID"',
        "--master-port=29500",
        "-m tidal.trainer",
        "orchestrator tidal.orchestrator",
        "weightsync tidal.weightsync",
        "inference tidal.inference",
        "-m tidal.cli.job_service",
        "#SBATCH --requeue",
    ):
        assert line in script, line
    assert not (tmp_path / "job" / "logs" / "trainer.log").exists()  # nothing ran


def test_explicit_world_size_that_disagrees_with_the_nodes_is_refused(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "--slurm.trainer-nodes", "2", "--trainer.world-size", "3")
    assert done.returncode == 2
    assert "trainer.world_size = 3 but slurm.trainer_nodes × gpus_per_node = 2" in done.stderr


def test_a_users_template_replaces_the_default(tmp_path: Path) -> None:
    template = tmp_path / "mine.j2"
    template.write_text("#!/bin/sh\n# {{ job_name }} on {{ nodes }} nodes, ws {{ world_size }}\n")
    slurm = SlurmConfig(template=template, job_name="mine", inference_nodes=0)
    out = render(slurm, run_name="r", run_dir=tmp_path, endpoints=Endpoints())
    assert out == "#!/bin/sh\n# mine on 1 nodes, ws 1\n"


def test_a_template_naming_an_unknown_value_fails_with_its_path(tmp_path: Path) -> None:
    template = tmp_path / "bad.j2"
    template.write_text("{{ no_such_value }}")
    with pytest.raises(ConfigError, match=r"slurm.template .*bad.j2.*no_such_value"):
        render(
            SlurmConfig(template=template), run_name="r", run_dir=tmp_path, endpoints=Endpoints()
        )


@pytest.mark.parametrize(
    ("flags", "folder", "file", "script"),
    [((), 0o700, 0o600, 0o700), (("--run.shared-readable", "true"), 0o755, 0o644, 0o744)],
)
def test_the_job_folder_follows_the_runs_file_policy(
    tmp_path: Path, flags: tuple[str, ...], folder: int, file: int, script: int
) -> None:
    done = dry_run(tmp_path, "--slurm.trainer-nodes", "1", *flags)
    assert done.returncode == 0, done.stderr
    job = tmp_path / "job"
    assert stat.S_IMODE(job.stat().st_mode) == stat.S_IMODE((job / "logs").stat().st_mode) == folder
    for name in ("config.toml", "launch.toml"):
        assert stat.S_IMODE((job / name).stat().st_mode) == file, name
    assert stat.S_IMODE((job / "tidal.sbatch").stat().st_mode) == script


def test_the_jobs_ports_inside_the_ephemeral_range_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defaults lie inside Linux's range; ports below it, or metrics on a free port,
    leave nothing to say."""
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("32768\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", range_file)
    note = ephemeral_ports_note(Endpoints(), MetricsConfig(), SlurmConfig())
    assert note is not None and "(32768-60999)" in note and "below 32768" in note
    assert "endpoints.weightsync 50054" in note and "endpoints.trainer's metrics port 51053" in note
    assert "rdzv" not in note  # 29500 lies below
    low = Endpoints(
        orchestrator="127.0.0.1:20051",
        inference="127.0.0.1:20052",
        trainer="127.0.0.1:20053",
        weightsync="127.0.0.1:20054",
    )
    assert ephemeral_ports_note(low, MetricsConfig(), SlurmConfig()) is None
    assert ephemeral_ports_note(low, MetricsConfig(port=0), SlurmConfig()) is None
    assert ephemeral_ports_note(low, MetricsConfig(port=40000), SlurmConfig()) is not None
    quiet_metrics = ephemeral_ports_note(
        low, MetricsConfig(enabled=False), SlurmConfig(rdzv_port=40000)
    )
    assert quiet_metrics is not None and quiet_metrics.count(" 40000") == 1
    assert "slurm.rdzv_port 40000" in quiet_metrics and "metrics" not in quiet_metrics
