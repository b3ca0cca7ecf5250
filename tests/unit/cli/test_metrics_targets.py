"""`tidal rl`'s metrics ports: one free port per child, passed on every start and listed
in prometheus_targets.json (Prometheus file_sd format)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from tidal.cli.config import RunConfig
from tidal.cli.launcher import child_specs
from tidal.cli.metrics_targets import TARGETS_FILE, with_metrics_ports


def test_every_child_gets_its_own_port_on_start_and_restart(tmp_path: Path) -> None:
    config = RunConfig.model_validate({"inference": {"replicas": 2}})
    config.endpoints.inference_replicas = ["127.0.0.1:7001", "127.0.0.1:7002"]
    ports = itertools.count(9100)
    specs = with_metrics_ports(child_specs(config), tmp_path, "demo", lambda: next(ports))
    names = [s.name for s in specs]
    assert names == ["weightsync", "trainer", "inference-0", "inference-1", "orchestrator"]
    for port, spec in enumerate(specs, start=9100):
        assert spec.args[-2:] == ("--metrics.port", str(port))
        assert spec.restart_args[-2:] == ("--metrics.port", str(port))  # same port again
    targets = json.loads((tmp_path / TARGETS_FILE).read_text())
    assert targets[2] == {
        "targets": ["127.0.0.1:9102"],
        "labels": {"service": "inference", "child": "inference-0", "run": "demo"},
    }
    assert [t["labels"]["service"] for t in targets] == [
        "weightsync", "trainer", "inference", "inference", "orchestrator"
    ]  # fmt: skip


def test_ports_already_in_the_run_are_not_handed_out_again(tmp_path: Path) -> None:
    config = RunConfig()
    offered = iter([50052, 9000, 9000, 9001, 9002, 9003])  # a gRPC port, then a repeat
    specs = with_metrics_ports(
        child_specs(config), tmp_path, "demo", lambda: next(offered), taken={50051, 50052}
    )
    assert [s.args[-1] for s in specs] == ["9000", "9001", "9002", "9003"]
