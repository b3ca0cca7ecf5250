"""Kill the orchestrator while agent episodes are half recorded, resume it: every step is
trained exactly once, and no episode the dead orchestrator had begun is trained.

The four services run as separately started processes (tests/helpers/split_runs.py).
The agent is a curl script run per episode in the sandbox that makes its chat call, then
waits a moment before posting its reward (`self_reward`): the kill lands while such an
agent waits, its call recorded by the gateway and its reward not.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import prepare_run_dir
from tidal.common.config.loading import load_config
from tidal.orchestrator.records.run_log import run_log_records

from ..helpers.agent_programs import self_rewarding_task, write_agent
from ..helpers.processes import processes_with
from ..helpers.split_runs import running_services, start_service, trainer_status

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
PROMPTS, GROUP = 2, 2
PAUSE = "1.37"
"""Seconds a half-recorded episode waits between its call and its reward (an odd figure:
the test finds such agents by their `sleep` command line)."""

SLOW_REWARDER = f"""#!/bin/sh
# one chat call, a pause with the call recorded and no reward yet, then the reward
set -eu
body=$(jq -c '{{model: "policy", messages: .messages}}')
reply=$(curl -sS --fail-with-body -H "Authorization: Bearer $OPENAI_API_KEY" \\
  -H "Content-Type: application/json" -d "$body" "$OPENAI_BASE_URL/chat/completions")
sleep {PAUSE}
curl -sS --fail-with-body -H "Authorization: Bearer $OPENAI_API_KEY" \\
  -H "Content-Type: application/json" -d '{{"reward": 1.0}}' "$TIDAL_REWARD_URL" >/dev/null
printf '%s' "$reply" | jq -r '.choices[0].message.content'
"""


def _agent_toml(tmp_path: Path, folder: Path) -> Path:
    script = write_agent(folder, "slow_rewarder.sh", SLOW_REWARDER)
    return self_rewarding_task(tmp_path / "agent.toml", [str(script)])


def _rl_records(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    # read while the orchestrator runs: a line being written is skipped
    records = run_log_records(run_dir / "metrics.jsonl")
    return [r for r in records if r.get("phase") == "rl"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_restart_mid_episode_trains_every_step_once_and_no_half_episode(
    tmp_path: Path, agent_dir: Path
) -> None:
    argv = [
        "@", str(ROOT / "configs" / "default.toml"), "@", str(_agent_toml(tmp_path, agent_dir)),
        "--orchestrator.warmup-steps", "0",
        "--orchestrator.steps", str(STEPS),
        "--orchestrator.prompts-per-step", str(PROMPTS),
        "--orchestrator.group-size", str(GROUP),
        "--orchestrator.report.table-every", "0",
        "--grpc.shutdown-grace-s", "0.5",
        "--run.output-dir", str(tmp_path / "out"), "--run.name", "agent",
    ]  # fmt: skip
    config, _ = load_config(RunConfig, argv)
    run_dir = prepare_run_dir(config)
    waiting = f"sleep\x00{PAUSE}\x00".encode()  # an agent between its call and its reward
    agents = str(agent_dir).encode()  # every process of an agent (its script's path)
    try:
        with running_services(run_dir) as services:
            orchestrator = services["orchestrator"]
            log = (run_dir / "logs" / "orchestrator.log").read_text
            deadline = time.monotonic() + 240
            while not (_rl_records(run_dir) and processes_with(waiting)):
                assert orchestrator.poll() is None, log()
                assert time.monotonic() < deadline, "no step trained with an episode in flight"
                time.sleep(0.02)
            orchestrator.send_signal(signal.SIGKILL)
            orchestrator.wait(timeout=30)
            trained_before = {r["step"] for r in _rl_records(run_dir)}
            assert len(trained_before) < STEPS  # it died mid-run

            # the dead orchestrator's sandboxed agents die with it: none posts a reward later
            gone_by = time.monotonic() + 15
            while processes_with(agents):
                assert time.monotonic() < gone_by, "agent processes outlived their orchestrator"
                time.sleep(0.1)

            services["orchestrator"] = resumed = start_service(
                "orchestrator", run_dir, "--orchestrator.resume", "true"
            )
            assert resumed.wait(timeout=300) == 0, log()
            status = trainer_status(run_dir, config.endpoints.trainer)
    finally:
        for pid in processes_with(agents):  # a failed test must not leave agents running
            os.kill(pid, signal.SIGKILL)

    # every step trained exactly once across both lives: none lost, none repeated
    assert (status.step, status.steps_trained) == (STEPS, STEPS)
    records = _rl_records(run_dir)
    assert {r["step"] for r in records} == set(range(1, STEPS + 1))
    # a trained step holds whole episodes only: each posted its reward, none was dropped
    for record in records:
        assert record["samples"] == PROMPTS * GROUP, record
        assert record["reward_mean"] == 1.0, record
        assert not [k for k in record if k.startswith("episode/dropped_")], record
    assert "resume: trainer at step" in (run_dir / "logs" / "orchestrator.log").read_text()
