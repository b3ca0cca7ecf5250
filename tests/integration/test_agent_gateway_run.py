"""Agent programs trained through the session gateway, on the real stack through the launcher.

A curl script (no Python) run per episode in the sandbox completes episodes that are
trained, within the async window (`max_async`) and the off-policy bound; the Python ReAct
agent on the `openai` client, as a long-running agent service, learns the lookup tool
task on the tiny default model as the built-in tool loop does.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.agent_programs import curl_command, react_service, self_rewarding_task
from tidal.orchestrator.config import StalenessConfig
from tidal.orchestrator.records.run_log import run_log_records

from .conftest import LOOKUP_CONFIG, from_warmed

RL_STEPS = 30
REWARD_GAIN = 0.2
"""Mean reward of the last 5 RL steps over the first 5 (the built-in tool loop's bound)."""
LIMIT_S = 900
CURL_STEPS = 4
MAX_ASYNC = 2


def _records(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    return [r for r in run_log_records(run_dir / "metrics.jsonl") if r["phase"] == "rl"]


def _mean(records: list[dict], key: str) -> float:  # type: ignore[type-arg]
    return sum(r.get(key, 0.0) for r in records) / len(records)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
def test_a_curl_agent_completes_episodes_that_are_trained(  # type: ignore[no-untyped-def]
    launch, tmp_path: Path, agent_dir: Path
) -> None:
    agent = self_rewarding_task(tmp_path / "agent.toml", curl_command(agent_dir, reward=True))
    run = launch(
        "@",
        str(agent),
        "--orchestrator.warmup-steps", "0",
        "--orchestrator.steps", str(CURL_STEPS),
        "--orchestrator.staleness.max-async", str(MAX_ASYNC),
        "--orchestrator.prompts-per-step", "2",
        "--orchestrator.group-size", "2",
        "--orchestrator.report.table-every", "0",
        "--grpc.shutdown-grace-s", "0.5",
    )  # fmt: skip
    output = run.communicate(timeout=240)
    assert run.process.returncode == 0, output
    rl = _records(run.run_dir)
    assert len(rl) == CURL_STEPS
    bound = StalenessConfig(max_async=MAX_ASYNC).bound
    for record in rl:  # every episode trained, none dropped, each with the reward it posted
        assert record["samples"] == 4, record
        assert record["reward_mean"] == 1.0
        assert not [k for k in record if k.startswith("episode/dropped_")], record
        # the gateway's calls were admitted by the async window, and no trained sample
        # is staler than the bound (none was dropped for it either)
        assert record["staleness/gate"] <= MAX_ASYNC, record
        assert record["staleness/max"] <= bound, record
        assert record["dropped_stale"] == 0, record
    # generation really ran ahead: a step's episodes started before the last step trained
    assert max(r["staleness/gate"] for r in rl) >= 1


@pytest.mark.slow
@pytest.mark.timeout(LIMIT_S + 60)
def test_a_react_agent_service_learns_the_lookup_tool_task(  # type: ignore[no-untyped-def]
    launch, tmp_path: Path, lookup_warmed: Path
) -> None:
    port = _free_port()
    service = subprocess.Popen(
        [*react_service(tmp_path), "--serve", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert service.stdout is not None and "serving" in service.stdout.readline()
        agent = tmp_path / "agent.toml"
        agent.write_text(
            "[orchestrator.task]\n"
            'type = "agent"\n'
            f'url = "http://127.0.0.1:{port}/"\n'
            "[orchestrator.task.problems]\n"
            'type = "lookup"\n'
            "key_len = 1\n"
            "value_len = 1\n"
            "guess_fraction = 0.5\n"
        )
        started = time.monotonic()
        run = launch(
            "@", str(LOOKUP_CONFIG), "@", str(agent), *from_warmed(lookup_warmed),
            "--orchestrator.steps", str(RL_STEPS),
            "--orchestrator.report.table-every", "0",
            "--grpc.shutdown-grace-s", "0.5",
        )  # fmt: skip
        output = run.communicate(timeout=LIMIT_S)
        assert run.process.returncode == 0, output
        assert time.monotonic() - started < LIMIT_S
    finally:
        service.kill()
        service.wait()
    rl = _records(run.run_dir)
    assert len(rl) == RL_STEPS
    first, last = rl[:5], rl[-5:]
    reward = _mean(first, "reward_mean"), _mean(last, "reward_mean")
    # Means of rewards in 64ths: a rise of exactly the bound must not fail on rounding.
    rise = reward[1] - reward[0]
    assert rise >= REWARD_GAIN - 1e-9, f"reward {reward[0]:.3f} -> {reward[1]:.3f}"
    calls = _mean(first, "tools/calls_per_episode"), _mean(last, "tools/calls_per_episode")
    assert calls[1] > calls[0], f"calls per episode {calls[0]:.2f} -> {calls[1]:.2f}"
