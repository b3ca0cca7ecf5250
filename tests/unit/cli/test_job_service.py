"""A SLURM job's service under `tidal.cli.job_service`: a crash is restarted with the
launcher's supervision (the budget and backoff of `[supervision]` in launch.toml), the
restart is told to continue, and the restart lands in the service's own record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

# A stand-in service named like the orchestrator (so its restart gets the orchestrator's
# continue arguments): life 1 crashes, life 2 exits 0.
SERVICE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    lives = Path(sys.argv[2]).parent / "lives"
    life = int(lives.read_text()) + 1 if lives.exists() else 1
    lives.write_text(str(life))
    print(f"life {life} args {sys.argv[3:]}", flush=True)
    sys.exit(1 if life == 1 else 0)
    """
)


def _job_service(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli.job_service", "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(run_dir)},
    )


def _run_dir(tmp_path: Path, supervision: str) -> Path:
    (tmp_path / "orchestrator.py").write_text(SERVICE)
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "launch.toml").write_text(f"[supervision]\n{supervision}\n")
    return tmp_path


def test_a_crashed_service_is_restarted_and_told_to_continue(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "backoff_s = 0")
    done = _job_service(run_dir, "orchestrator", "orchestrator", "--x", "1")
    assert done.returncode == 0, done.stderr
    log = (run_dir / "logs" / "orchestrator.log").read_text()
    assert "life 1 args ['--x', '1']" in log
    assert "life 2 args ['--x', '1', '--orchestrator.resume', 'true']" in log
    record = json.loads((run_dir / "supervision-orchestrator.json").read_text())
    assert record["restarts"] == {"orchestrator": 1}


def test_a_requeued_job_continues_from_the_first_start(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "max_restarts = 0")
    (run_dir / "lives").write_text("1")  # the next life exits 0
    done = _job_service(run_dir, "--resume", "orchestrator", "orchestrator")
    assert done.returncode == 0, done.stderr
    assert (
        "life 2 args ['--orchestrator.resume', 'true']"
        in (run_dir / "logs" / "orchestrator.log").read_text()
    )


def test_the_restart_budget_of_the_launch_config_holds(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "max_restarts = 0")
    done = _job_service(run_dir, "orchestrator", "orchestrator")
    assert done.returncode == 1
    assert "restart budget is spent (0 of supervision.max_restarts = 0)" in done.stderr
