"""The fault suite: SIGKILL each service of a running `tidal rl` twice; the run survives.

One real run per service (the default stack on loopback, 12 steps, a checkpoint every 4
steps and the step journal between them, so a trainer life resumes from either), in
which that service is SIGKILLed twice at seeded random points: right after the trainer
trained a random step (its checkpoint-and-publish window), then a random fraction of a
step after another random step's metrics line. The launcher restarts it
(supervision.py); the others ride the loss out. Asserted for each: the run finishes
(exit 0); the trainer's surviving lineage trains every step id 1..N exactly once (read
from the trainer's log across its lives: a life's steps after the checkpoint the next
life resumed from are either replayed from the journal by that life or were lost with it
and retrained); `metrics.jsonl` has exactly one line per step; inference skipped no
version as corrupt or foreign, and every version on disk matches its manifest's sha256;
the launcher counted exactly these two restarts, and nothing else had to be restarted
(the others rode the loss out). Each run takes ~35-70 s on a loaded 2-core machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_steps

SERVICES = ("trainer", "weightsync", "inference", "orchestrator")
STEPS, WARMUP = 10, 2
TOTAL = STEPS + WARMUP
KILLS = 2
SEED = 17
RUN_TIMEOUT_S = 150
# The runner's own line: a refusal's message ("... (last trained step 5)") is not a step.
TRAINED = re.compile(r"tidal\.trainer\.runner: trained step (\d+)\b")
RESUMED = re.compile(r"resumed from \S+ \(step (\d+)\)")
REPLAYED = re.compile(r"tidal\.trainer\.runner: replayed step (\d+) from the step journal")


def _metrics_steps(run_dir: Path) -> list[int]:
    return run_log_steps(run_dir / "metrics.jsonl")


def _service_pid(run_dir: Path, service: str) -> int | None:
    needle = str(run_dir / "config.toml").encode()
    module = f"tidal.{service}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in argv and module in argv:
            return int(proc.name)
    return None


def surviving_lineage(trainer_log: str) -> list[int]:
    """The steps of the lineage that survived, in training order (see module doc)."""
    lineage: list[int] = []
    for line in trainer_log.splitlines():
        if m := RESUMED.search(line):  # a new life: what its checkpoint holds survives
            lineage = [s for s in lineage if s <= int(m.group(1))]
        elif m := TRAINED.search(line) or REPLAYED.search(line):
            lineage.append(int(m.group(1)))
    return lineage


def _verify_versions(weights: Path) -> list[int]:
    """Every version folder on disk is the run's own (version = step, at its own folder)
    and matches its manifest (sha256 of each file)."""
    checked = []
    for manifest_path in sorted(weights.glob("v*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        version = int(manifest_path.parent.name[1:])
        assert manifest["version"] == manifest["step"] == version, manifest_path
        assert Path(manifest["location"]).resolve() == manifest_path.parent.resolve()
        for entry in manifest["files"]:
            data = (manifest_path.parent / entry["path"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"], (manifest_path, entry)
        checked.append(version)
    return checked


def _trained_steps(run_dir: Path) -> list[int]:
    path = run_dir / "logs" / "trainer.log"
    return [int(s) for s in TRAINED.findall(path.read_text())] if path.is_file() else []


def _kill_points(service: str) -> list[tuple[str, int, float]]:
    """(which progress to wait for, the step, then how long to wait) for each kill,
    reproducibly: the first kill follows the trainer's "trained step k" line (inside the
    step's checkpoint-and-publish window), the second a step's metrics line (anywhere
    in the next step: generation, packing, Train)."""
    rng = random.Random(f"{SEED}-{service}")
    first = rng.randint(1, TOTAL // 2 - 1)
    second = rng.randint(first + 2, TOTAL - 2)
    return [("trained", first, rng.uniform(0, 0.05)), ("metrics", second, rng.uniform(0, 0.6))]


@pytest.mark.slow
@pytest.mark.parametrize("service", SERVICES)
def test_run_survives_two_sigkills_of(service: str, launch) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    run = launch(
        "--orchestrator.steps", str(STEPS),
        "--orchestrator.warmup-steps", str(WARMUP),
        "--orchestrator.report.table-every", "0",
        "--trainer.ckpt.interval", "4",
        "--supervision.backoff-s", "0.2",
        "--grpc.shutdown-grace-s", "0.5",
    )  # fmt: skip
    run.wait_for_config()
    deadline = started + RUN_TIMEOUT_S
    killed: list[int] = []
    for source, after_step, delay in _kill_points(service):
        progress = _trained_steps if source == "trained" else _metrics_steps
        while max(progress(run.run_dir), default=0) < after_step:
            assert run.process.poll() is None and time.monotonic() < deadline, run.output()
            time.sleep(0.05)
        time.sleep(delay)
        pid = _service_pid(run.run_dir, service)
        while pid is None or pid in killed:  # the previous life is still being replaced
            assert run.process.poll() is None and time.monotonic() < deadline, run.output()
            time.sleep(0.05)
            pid = _service_pid(run.run_dir, service)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    code = run.process.wait(timeout=max(1.0, deadline - time.monotonic()))
    output = run.output()
    assert code == 0, output
    assert "run finished" in output

    logs = run.run_dir / "logs"
    supervision = json.loads((run.run_dir / "supervision.json").read_text())
    expected = {name: (KILLS if name == service else 0) for name in SERVICES}
    assert supervision["restarts"] == expected, (supervision, output)
    assert f"{KILLS} restart(s): {KILLS} {service}" in output

    lineage = surviving_lineage((logs / "trainer.log").read_text())
    assert lineage == list(range(1, TOTAL + 1)), lineage
    assert sorted(_metrics_steps(run.run_dir)) == list(range(1, TOTAL + 1))

    inference_log = (logs / "inference.log").read_text()
    assert "skipping version" not in inference_log
    assert "skipping broadcast version" not in inference_log
    assert TOTAL in _verify_versions(run.run_dir / "weights")
    print(f"{service}: killed {killed}, {time.monotonic() - started:.0f}s")
