"""The launcher's supervision loop against real child processes (tiny Python modules):
restarts with backoff within a budget, the finisher's exit 0 ends the run, a spent budget
or a configuration error fails it naming the child and its last lines, and the record;
each life learns its restart count (TIDAL_RESTARTS, its `tidal_restarts_total`)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tidal.cli.supervision import ChildSpec, SupervisionConfig, Supervisor, backoff

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    name = os.environ["CHILD_NAME"]
    lives = Path(os.environ["CHILD_DIR"]) / f"{name}.lives"
    life = int(lives.read_text()) + 1 if lives.exists() else 1
    lives.write_text(str(life))
    print(f"{name} life {life} args {sys.argv[3:]}", flush=True)
    print(f"{name} restarts {os.environ['TIDAL_RESTARTS']}", flush=True)
    plan = os.environ["CHILD_PLAN"].split(",")  # one exit code per life, "run" = keep running
    action = plan[min(life, len(plan)) - 1]
    for _ in range(int(os.environ.get("CHILD_LINES", "0"))):  # more than a pipe holds
        print("x" * 1000, flush=True)
    if action == "run":
        time.sleep(60)
    time.sleep(float(os.environ.get("CHILD_DELAY", "0")))
    if os.environ.get("CHILD_AWAIT"):  # "<file>=<text>": exit only once it holds that
        path, text = os.environ["CHILD_AWAIT"].split("=")
        for _ in range(600):
            awaited = Path(os.environ["CHILD_DIR"]) / path
            if awaited.exists() and awaited.read_text() == text:
                break
            time.sleep(0.05)
    sys.exit(int(action))
    """
)


def _spec(
    tmp_path: Path, name: str, plan: str, delay: float = 0.0, wait_for: str = ""
) -> ChildSpec:
    env = {
        "CHILD_AWAIT": wait_for,
        "PYTHONPATH": str(tmp_path),
        "CHILD_NAME": name,
        "CHILD_DIR": str(tmp_path),
        "CHILD_PLAN": plan,
        "CHILD_DELAY": str(delay),
    }
    return ChildSpec(name, "child", args=("--first",), restart_args=("--again",), env=env)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "logs").mkdir()
    (tmp_path / "config.toml").write_text("")
    return tmp_path


FAST = SupervisionConfig(max_restarts=2, backoff_s=0.01, max_backoff_s=0.02)


def test_backoff_doubles_up_to_its_cap() -> None:
    config = SupervisionConfig(backoff_s=1.0, max_backoff_s=5.0)
    assert [backoff(config, k) for k in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]


async def test_crashed_children_are_restarted_with_restart_args_and_counted(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = [
        _spec(run_dir, "helper", "1,-9,run"),  # crashes twice, then stays up
        # The finisher crashes once, then exits 0 (finished) after the helper's restarts.
        _spec(run_dir, "orchestrator", "3,0", delay=0.2, wait_for="helper.lives=3"),
    ]
    code = await Supervisor(run_dir, specs, FAST).run()
    out = capsys.readouterr()
    assert code == 0, out
    assert "run finished" in out.out
    assert "3 restart(s): 2 helper, 1 orchestrator" in out.out
    helper_log = (run_dir / "logs" / "helper.log").read_text()
    assert "helper life 1 args ['--first']" in helper_log
    assert "helper life 3 args ['--again']" in helper_log
    # each life is told its restarts so far (its tidal_restarts_total)
    assert [line for line in helper_log.splitlines() if "restarts" in line] == [
        f"helper restarts {n}" for n in range(3)
    ]
    assert "helper exited with code 1; restarting it" in out.err
    record = json.loads((run_dir / "supervision.json").read_text())
    assert record["restarts"] == {"helper": 2, "orchestrator": 1}
    assert all(e["restarted"] for e in record["exits"])


async def test_a_spent_budget_fails_the_run_naming_the_child_and_its_last_lines(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = [_spec(run_dir, "helper", "1"), _spec(run_dir, "orchestrator", "run")]
    code = await Supervisor(run_dir, specs, FAST).run()
    err = capsys.readouterr().err
    assert code == 1
    assert "helper exited with code 1; its restart budget is spent (2 of" in err
    assert "  | helper life 3 args ['--again']" in err
    assert (run_dir / "orchestrator.lives").read_text() == "1"  # stopped, not restarted
    record = json.loads((run_dir / "supervision.json").read_text())
    assert [e["restarted"] for e in record["exits"]] == [True, True, False]


async def test_a_configuration_error_is_not_restarted(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = [_spec(run_dir, "helper", "2"), _spec(run_dir, "orchestrator", "run")]
    assert await Supervisor(run_dir, specs, FAST).run() == 1
    assert "configuration error (exit code 2) is not restarted" in capsys.readouterr().err
    assert (run_dir / "helper.lives").read_text() == "1"


async def test_a_child_that_cannot_continue_is_not_restarted(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(run_dir, "trainer", "1")
    spec = ChildSpec(**{**spec.__dict__, "can_restart": lambda: "no checkpoint to resume"})
    specs = [spec, _spec(run_dir, "orchestrator", "run")]
    assert await Supervisor(run_dir, specs, FAST).run() == 1
    assert "trainer exited with code 1; no checkpoint to resume" in capsys.readouterr().err


async def test_a_full_disk_ends_the_run_once_naming_resume_without_restarts(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = [_spec(run_dir, "helper", "run"), _spec(run_dir, "orchestrator", "74")]
    assert await Supervisor(run_dir, specs, FAST).run() == 74
    err = capsys.readouterr().err
    assert "orchestrator exited with code 74; the disk is full" in err
    assert "with --resume" in err and "  | " not in err  # its own message, not its tail
    assert (run_dir / "orchestrator.lives").read_text() == "1"
    assert (run_dir / "helper.lives").read_text() == "1"  # stopped, not restarted


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
async def test_a_child_whose_log_cannot_be_written_is_still_drained(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / "logs" / "orchestrator.log").symlink_to("/dev/full")
    spec = _spec(run_dir, "orchestrator", "0")
    spec.env["CHILD_LINES"] = "500"  # 500 kB: blocks on its stdout unless it is read
    assert await Supervisor(run_dir, [spec], FAST).run() == 0
    err = capsys.readouterr().err
    assert err.count("cannot write") == 1 and "No space left on device" in err
