"""The whole stack as real processes through the real launcher (`tidal rl`)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from pathlib import Path

import grpc
import pytest

from tidal.orchestrator.records.run_log import run_log_records
from tidal.rpc.v1 import common_pb2, inference_pb2_grpc, trainer_pb2_grpc

from ..tls_fixtures import role_channel

WARMUP, STEPS = 1, 3
TOTAL = WARMUP + STEPS


def _status(run_dir: Path, address: str, stub_cls, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    # As `tidal client` does: mTLS with the run's operator certificate.
    with role_channel(run_dir / "tls", "operator", address) as channel:
        try:
            return stub_cls(channel).GetStatus(common_pb2.StatusRequest(), timeout=timeout)
        except grpc.RpcError:
            return None


def _spans(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    lines = (run_dir / "traces.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.slow
def test_stack_trains_each_step_once_advances_inference_and_traces_all_services(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--orchestrator.steps",
        str(STEPS),
        "--orchestrator.warmup-steps",
        str(WARMUP),
        "--orchestrator.exit-when-done",
        "false",
    )
    endpoints = run.wait_for_config()["endpoints"]
    versions_seen: set[int] = set()
    trainer = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert run.process.poll() is None, run.output()
        inference = _status(
            run.run_dir, endpoints["inference"], inference_pb2_grpc.InferenceServiceStub
        )
        trainer = _status(run.run_dir, endpoints["trainer"], trainer_pb2_grpc.TrainerServiceStub)
        if inference is not None and inference.policy_version >= 0:
            versions_seen.add(inference.policy_version)
        if trainer is not None and trainer.step == TOTAL and TOTAL in versions_seen:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"run did not reach step {TOTAL}: versions {versions_seen}, trainer {trainer}")

    # inference's policy version advanced, up to the last published version
    assert len(versions_seen) >= 2 and max(versions_seen) == TOTAL
    # the trainer trained each step exactly once
    assert trainer is not None
    assert (trainer.steps_trained, trainer.policy_version) == (TOTAL, TOTAL)
    metrics = run_log_records(run.run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, TOTAL + 1))

    assert run.stop() == 130  # Ctrl-C: every child stopped gracefully
    assert run.children() == []

    # one RL step's spans from all four services share one trace id
    services_by_trace: dict[str, set[str]] = defaultdict(set)
    for span in _spans(run.run_dir):
        services_by_trace[span["context"]["trace_id"]].add(
            span["resource"]["attributes"]["service.name"]
        )
    step_traces = {
        s["context"]["trace_id"]: s["attributes"].get("tidal.step")
        for s in _spans(run.run_dir)
        if s["name"] == "rl_step"
    }
    complete = [
        step
        for trace_id, step in step_traces.items()
        if services_by_trace[trace_id]
        >= {"tidal-orchestrator", "tidal-inference", "tidal-trainer", "tidal-weightsync"}
    ]
    assert complete, f"no step trace spans all four services: {dict(services_by_trace)}"
    for name in ("orchestrator", "inference", "trainer", "weightsync"):
        assert (run.run_dir / "logs" / f"{name}.log").stat().st_size > 0


def test_unknown_config_key_fails_before_anything_starts(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch("--trainer.optim.lrr", "1e-4")
    assert run.process.wait(timeout=60) == 2
    out = run.output()
    assert "unknown key 'trainer.optim.lrr'" in out and "did you mean 'trainer.optim.lr'" in out
    assert not run.run_dir.exists()


@pytest.mark.slow
def test_a_dying_child_fails_the_run_with_its_last_log_lines(launch) -> None:  # type: ignore[no-untyped-def]
    # No restart budget: a trainer that can restart (nothing lost yet) would otherwise be
    # restarted; supervision's own tests cover restarts.
    run = launch(
        "--orchestrator.steps", "1000", "--orchestrator.warmup-steps", "0",
        "--supervision.max-restarts", "0",
    )  # fmt: skip
    endpoints = run.wait_for_config()["endpoints"]
    deadline = time.monotonic() + 120
    while _status(run.run_dir, endpoints["trainer"], trainer_pb2_grpc.TrainerServiceStub) is None:
        assert time.monotonic() < deadline and run.process.poll() is None, run.output()
        time.sleep(0.2)
    trainer_pids = [
        pid
        for pid in run.children()
        if b"tidal.trainer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(trainer_pids) == 1
    os.kill(trainer_pids[0], signal.SIGKILL)
    assert run.process.wait(timeout=60) == 1
    out = run.output()
    assert "trainer killed by signal SIGKILL" in out
    assert "  | " in out  # the trainer's last log lines are shown
    time.sleep(1)
    assert run.children() == []
