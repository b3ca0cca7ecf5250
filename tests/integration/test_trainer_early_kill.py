"""A trainer SIGKILLed before its first checkpoint is restarted, and the run completes.

The default stack through the real launcher (the step journal on, `trainer.ckpt.interval`
unset: no checkpoint within these steps), the trainer killed either 2 s after its process
appeared (still importing, or publishing version 0) or the moment version 0 is on disk.
Nothing trained is lost, so the launcher restarts it; the new life resumes at step 0
(its initial weights, the journal after them) under the published version 0. Asserted:
the run finishes, with exactly that one restart, every step id trained exactly once by
the surviving lineage and one metrics line per step.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tidal.weights.folder import version_dir
from tidal.weights.manifest import MANIFEST_FILE

from .test_fault_suite import SERVICES, _metrics_steps, _service_pid, surviving_lineage

STEPS, WARMUP = 3, 1
TOTAL = STEPS + WARMUP
RUN_TIMEOUT_S = 150


def _wait(until: str, run_dir: Path, deadline: float, process) -> int:  # type: ignore[no-untyped-def]
    """The trainer's pid, once `until` ("launch": its process exists, "version 0": that
    version's manifest is on disk) holds."""
    v0 = version_dir(run_dir / "weights", 0) / MANIFEST_FILE
    while True:
        pid = _service_pid(run_dir, "trainer")
        if pid is not None and (until == "launch" or v0.is_file()):
            return pid
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["launch", "version 0"])
def test_a_trainer_killed_before_its_first_checkpoint_is_restarted(when: str, launch) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    run = launch(
        "--orchestrator.steps", str(STEPS),
        "--orchestrator.warmup-steps", str(WARMUP),
        "--orchestrator.report.table-every", "0",
        "--supervision.backoff-s", "0.2",
        "--grpc.shutdown-grace-s", "0.5",
    )  # fmt: skip
    run.wait_for_config()
    deadline = started + RUN_TIMEOUT_S
    pid = _wait(when, run.run_dir, deadline, run.process)
    if when == "launch":
        time.sleep(2.0)
    os.kill(pid, signal.SIGKILL)
    code = run.process.wait(timeout=max(1.0, deadline - time.monotonic()))
    output = run.output()
    assert code == 0, output
    assert "run finished" in output

    supervision = json.loads((run.run_dir / "supervision.json").read_text())
    expected = {name: (1 if name == "trainer" else 0) for name in SERVICES}
    assert supervision["restarts"] == expected, (supervision, output)
    trainer_log = (run.run_dir / "logs" / "trainer.log").read_text()
    assert "(step 0): no checkpoint yet" in trainer_log
    assert surviving_lineage(trainer_log) == list(range(1, TOTAL + 1))
    assert sorted(_metrics_steps(run.run_dir)) == list(range(1, TOTAL + 1))
