"""Which isolation an executor uses, chosen once: bubblewrap where usable, else the fallback
child process with a warning; and what the fallback still holds as root."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers.processes import processes_with
from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.sandbox import Sandbox, SandboxLimits
from tidal.orchestrator.scoring.sandbox.bubblewrap import find_bwrap

from .....helpers.sandbox_walls import ROOMY_WALL_S

needs_bwrap = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the fallback's uids need root")


@needs_bwrap
async def test_bubblewrap_is_used_where_installed_and_hides_the_host() -> None:
    sandbox = Sandbox(SandboxLimits(wall_s=ROOMY_WALL_S))
    assert sandbox.bwrap is not None
    result = await sandbox.run("import os\nprint(os.getpid(), sorted(os.listdir('/')))")
    pid, listing = result.stdout.split(" ", 1)
    assert pid == "2"  # pid 1 is the sandbox's own init: its end ends every process
    assert "home" not in listing and "root" not in listing and "var" not in listing


@needs_bwrap
async def test_bubblewrap_shows_a_lent_path_read_only_and_nothing_beside_it(
    tmp_path: Path,
) -> None:
    lent, beside = tmp_path / "lent", tmp_path / "beside"
    for folder in (lent, beside):
        folder.mkdir()
        (folder / "f").write_text("data")
    for folder in [tmp_path, *tmp_path.parents]:  # the sandbox uid resolves the path
        folder.chmod(folder.stat().st_mode | 0o001)
    lent.chmod(0o755)
    (lent / "f").chmod(0o644)
    probe = (
        "import os, sys\n"
        "print(open(sys.argv[1] + '/f').read(), os.path.exists(sys.argv[2]))\n"
        "try:\n    open(sys.argv[1] + '/g', 'w')\nexcept OSError as e:\n    print(e.errno)\n"
    )
    sandbox = Sandbox(SandboxLimits(wall_s=ROOMY_WALL_S))
    result = await sandbox.run(
        [sandbox.python, "-I", "-S", "-c", probe, str(lent), str(beside)],
        read_only=[str(lent)],
    )
    assert result.stdout.split() == ["data", "False", "30"], result.stderr  # 30: EROFS


def test_without_bubblewrap_the_fallback_warns_what_is_weaker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with caplog.at_level(logging.WARNING):
        sandbox = Sandbox()
    assert sandbox.bwrap is None
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "bubblewrap is not installed" in warning
    assert "no mount namespace" in warning and "no pid namespace" in warning


def test_isolation_bubblewrap_refuses_to_start_without_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="bubblewrap is not installed"):
        Sandbox(SandboxLimits(isolation="bubblewrap"))


@as_root
async def test_the_fallback_as_root_kills_what_left_the_session() -> None:
    marker = f"tidal-escape-{uuid.uuid4().hex[:12]}"
    escape = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv('/bin/sh', ['sh', '-c', 'sleep 600 # {marker}'])\n"
        "time.sleep(0.2)\n"
    )
    limits = SandboxLimits(isolation="process", wall_s=ROOMY_WALL_S)
    result = await Sandbox(limits).run(escape)
    # its escaped process held the pipes, yet the run ended with the program: it was reaped
    assert result.ok and result.seconds < ROOMY_WALL_S / 2
    deadline = time.monotonic() + 30.0
    while processes_with(marker.encode()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert processes_with(marker.encode()) == []


@as_root
def test_the_fallback_as_root_gives_each_execution_in_a_row_its_own_uid() -> None:
    sandbox = Sandbox(SandboxLimits(isolation="process", wall_s=ROOMY_WALL_S))
    uids = [asyncio.run(sandbox.run("import os\nprint(os.getuid())")).stdout for _ in range(3)]
    assert len(set(uids)) == 3 and "0\n" not in uids
