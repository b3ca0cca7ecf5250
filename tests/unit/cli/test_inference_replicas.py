"""`inference.replicas`: the launcher gives each replica its own port, registration id,
log file, OpenAI port and GPU slice; the services' config lists every replica; SLURM
places them over nodes; an old-style list in `endpoints.inference` names the new key."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.inference_replicas import split_devices
from tidal.cli.launcher import apply_placement, child_specs, prepare_run_dir
from tidal.cli.slurm import SlurmConfig, render
from tidal.common.config.loading import load_config
from tidal.common.config.shared import Endpoints
from tidal.common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ["@", str(ROOT / "configs" / "default.toml")]


def run_config(tmp_path: Path, *flags: str) -> RunConfig:
    argv = [*DEFAULT, "--run.output-dir", str(tmp_path), *flags]
    return load_config(RunConfig, argv, environ={})[0]


def test_each_replica_gets_its_own_port_id_log_and_http_port(tmp_path: Path) -> None:
    config = run_config(tmp_path, "--inference.replicas", "3", "--inference.http.enabled", "true")
    run_dir = prepare_run_dir(config)
    written = tomllib.loads((run_dir / "config.toml").read_text())
    addresses = written["endpoints"]["inference_replicas"]
    assert len(set(addresses)) == 3 and written["endpoints"]["inference"] == addresses[0]
    http_port = written["inference"]["http"]["port"]
    specs = [s for s in child_specs(config) if s.module == "tidal.inference"]
    assert [s.name for s in specs] == ["inference-0", "inference-1", "inference-2"]
    for i, spec in enumerate(specs):
        assert spec.args == spec.restart_args == (
            "--endpoints.inference", addresses[i],
            "--inference.replica_id", f"inference-{i}",
            "--inference.http.port", str(http_port + i),
        )  # fmt: skip
        assert spec.can_restart() is None
    names = [s.name for s in child_specs(config, resume=True)]
    assert names[0] == "weightsync" and names[-1] == "orchestrator"


def test_one_replica_keeps_the_single_replica_layout(tmp_path: Path) -> None:
    config = run_config(tmp_path)
    run_dir = prepare_run_dir(config)
    written = tomllib.loads((run_dir / "config.toml").read_text())
    assert written["endpoints"]["inference_replicas"] == []
    [spec] = [s for s in child_specs(config) if s.module == "tidal.inference"]
    assert (spec.name, spec.args) == ("inference", ())
    assert Endpoints(**written["endpoints"]).inference_addresses() == [
        written["endpoints"]["inference"]
    ]


def test_gpus_are_split_evenly_over_replicas(tmp_path: Path) -> None:
    config = run_config(tmp_path, "--inference.replicas", "2", "--deployment.num-infer-gpus", "4")
    envs = apply_placement(config, ["0", "1", "2", "3", "4"])
    assert split_devices(envs["inference"]["CUDA_VISIBLE_DEVICES"], 2) == ["0,1", "2,3"]
    odd = run_config(tmp_path, "--inference.replicas", "3", "--deployment.num-infer-gpus", "4")
    with pytest.raises(ConfigError, match="num_infer_gpus = 4 cannot be split evenly"):
        apply_placement(odd, ["0", "1", "2", "3"])


def test_a_list_in_endpoints_inference_names_the_new_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"endpoints\.inference_replicas"):
        run_config(tmp_path, "--endpoints.inference", '["a:1", "b:2"]')
    with pytest.raises(ConfigError, match="lists an address twice"):
        run_config(tmp_path, "--endpoints.inference-replicas", '["a:1", "a:1"]')


def test_slurm_spreads_replicas_over_inference_nodes_with_gpu_slices(tmp_path: Path) -> None:
    slurm = SlurmConfig(trainer_nodes=1, inference_nodes=2, gpus_per_node=4)
    script = render(slurm, run_name="r", run_dir=tmp_path, endpoints=Endpoints(), replicas=4)
    assert 'INFER_REPLICAS=("${NODES[1]}:50052" "${NODES[2]}:50052" "${NODES[1]}:50055" ' in script
    assert "--endpoints.inference-replicas" in script
    assert script.count(' tidal.inference "${SERVICE_ARGS[@]}"') == 4
    assert "env CUDA_VISIBLE_DEVICES=0,1 " in script and "env CUDA_VISIBLE_DEVICES=2,3 " in script
    assert "--inference.replica-id inference-3 > " in script and "/job-inference-3.log" in script
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    shared = SlurmConfig(trainer_nodes=1, inference_nodes=0)  # node 0 beside the trainer
    script = render(shared, run_name="r", run_dir=tmp_path, endpoints=Endpoints(), replicas=2)
    assert 'INFER_REPLICAS=("${NODES[0]}:50052" "${NODES[0]}:50055")' in script  # not 50053
    too_many = SlurmConfig(trainer_nodes=1, inference_nodes=1, gpus_per_node=2)
    with pytest.raises(ConfigError, match=r"add slurm\.inference_nodes"):
        render(too_many, run_name="r", run_dir=tmp_path, endpoints=Endpoints(), replicas=3)


def test_a_broadcast_group_follows_the_replica_count(tmp_path: Path) -> None:
    broadcast = ["--weightsync.transport.type", "broadcast", "--inference.replicas", "3"]
    config = run_config(tmp_path, *broadcast)
    assert config.weightsync.transport.replicas == 3  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"weightsync\.transport\.replicas = 4"):
        run_config(tmp_path, *broadcast, "--weightsync.transport.replicas", "4")
