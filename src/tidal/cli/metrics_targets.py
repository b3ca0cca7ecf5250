"""Where `tidal rl`'s children serve Prometheus metrics, and the file that says so.

The children's gRPC ports are random, so `port + metrics.port_offset` could be taken: each
child gets a free port of its own as `--metrics.port` (kept across restarts), listed in
`<run dir>/prometheus_targets.json` in Prometheus' file-based discovery format.
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
