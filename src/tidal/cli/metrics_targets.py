"""Where `tidal rl`'s children serve Prometheus metrics, and the file that says so.

Decisions:
- The children's gRPC ports are free loopback ports picked by the launcher, so `grpc port
  + metrics.port_offset` could land on a port something else holds. The launcher picks a
  free port per child instead and passes it as `--metrics.port` (first start and restart
  alike: a restarted child serves where its predecessor did).
- The chosen addresses are written to `<run dir>/prometheus_targets.json` in Prometheus'
  file-based service discovery format (a list of `{"targets": [...], "labels": {...}}`),
  so a Prometheus on the same host scrapes a run with `file_sd_configs` pointing at it,
  and a test or a person finds every endpoint in one place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from tidal.cli.supervision import ChildSpec

TARGETS_FILE = "prometheus_targets.json"


def service_of(child: str) -> str:
    """ "inference-1" → "inference"; other children are named after their service."""
    return child.split("-", 1)[0]


def with_metrics_ports(
    specs: Sequence[ChildSpec],
    run_dir: Path,
    run_name: str,
    free_port: Callable[[], int],
    taken: set[int] | None = None,
) -> list[ChildSpec]:
    """Each child with `--metrics.port <free port>` (none of `taken`, the run's other
    ports, and no two alike); writes the run's targets file."""
    out, targets = [], []
    used = set(taken or ())
    for spec in specs:
        port = free_port()
        while port in used:  # a port the run config already holds (free_port never repeats)
            port = free_port()
        used.add(port)
        flag = ("--metrics.port", str(port))
        out.append(
            replace(spec, args=(*spec.args, *flag), restart_args=(*spec.restart_args, *flag))
        )
        targets.append(
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": {"service": service_of(spec.name), "child": spec.name, "run": run_name},
            }
        )
    (run_dir / TARGETS_FILE).write_text(json.dumps(targets, indent=1) + "\n")
    return out
