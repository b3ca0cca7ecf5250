"""Hostile programs leave nothing behind, see none of the run and cannot forge a pass, whether
the service runs as root or not: as root the whole module runs again as an unprivileged
user (`test_the_battery_holds_as_an_unprivileged_user`)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers.processes import processes_with
from tidal.common.security.credentials import ensure_certificates
from tidal.orchestrator.scoring.sandbox import Sandbox, SandboxLimits
from tidal.orchestrator.task_config import CodeTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.orchestrator.tasks.base import Problem, Task

from .....helpers.sandbox_walls import ROOMY_WALL_S

FIXTURES = Path(__file__).parents[2] / "fixtures"
REPO = Path(__file__).parents[5]
HOST_TMP = Path(tempfile.gettempdir())
ESCAPE_DELAY_S = 1.0
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="separate uids need a root service")


@pytest.fixture
def marker() -> Iterator[str]:
    """A name no other test uses; whatever a program leaves under it is removed after."""
    name = f"tidal-hostile-{uuid.uuid4().hex[:12]}"
    yield name
    for folder in (HOST_TMP, Path("/dev/shm")):
        for path in folder.glob(f"{name}*"):
            path.unlink(missing_ok=True)


async def test_a_process_that_leaves_the_session_dies_with_the_program(marker: str) -> None:
    late_file = HOST_TMP / f"{marker}-late"
    escape = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        script = 'sleep {ESCAPE_DELAY_S}; echo x > {late_file}'\n"
        "        os.execv('/bin/sh', ['sh', '-c', script])\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
    )
    result = await Sandbox(SandboxLimits(wall_s=ROOMY_WALL_S)).run(escape)
    assert result.ok, result.stderr
    assert processes_with(marker.encode()) == []  # nothing of it is left running
    await asyncio.sleep(ESCAPE_DELAY_S + 0.5)
    assert not late_file.exists()


async def test_files_written_to_tmp_dev_shm_and_beside_the_work_dir_do_not_outlive_it(
    marker: str,
) -> None:
    program = (
        "import os\n"
        f"for path in ('/tmp/{marker}-tmp', '/dev/shm/{marker}-shm', '../{marker}-up'):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = await Sandbox(SandboxLimits(wall_s=ROOMY_WALL_S)).run(program)
    assert result.ok, result.stderr
    left = [*HOST_TMP.glob(f"{marker}*"), *Path("/dev/shm").glob(f"{marker}*")]
    assert left == []


def test_two_programs_in_a_row_from_one_worker_share_nothing(marker: str) -> None:
    """Each `asyncio.run` is one completion scored by a verifier worker."""
    sandbox = Sandbox(SandboxLimits(wall_s=ROOMY_WALL_S))
    first = (
        "import os\n"
        f"for path in ('/tmp/{marker}', '/dev/shm/{marker}', os.path.expanduser('~/{marker}')):\n"
        "    open(path, 'w').write('x')\n"
        "print(os.getuid())\n"
    )
    second = (
        "import os\n"
        f"for path in ('/tmp/{marker}', '/dev/shm/{marker}', os.path.expanduser('~/{marker}')):\n"
        "    print(path, os.path.exists(path))\n"
        "print(os.getuid())\n"
    )
    one = asyncio.run(sandbox.run(first))
    two = asyncio.run(sandbox.run(second))
    assert one.ok and two.ok, (one.stderr, two.stderr)
    *seen, uid = two.stdout.splitlines()
    assert [line.endswith(" False") for line in seen] == [True, True, True], seen
    if os.geteuid() == 0:
        assert uid != one.stdout.strip()  # as root, a fresh uid per execution


def test_a_fork_bomb_leaves_the_next_program_free_to_fork() -> None:
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    asyncio.run(Sandbox(SandboxLimits(wall_s=1.0, processes=16)).run(bomb))
    forks = (
        "import os\nfor _ in range(4):\n    if os.fork() == 0:\n        os._exit(0)\n    os.wait()"
    )
    # uids are the worker's, not an executor's
    result = asyncio.run(Sandbox(SandboxLimits(wall_s=ROOMY_WALL_S, processes=16)).run(forks))
    assert result.ok, result.stderr


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A run folder as a service leaves it (keys 0600, the folder traversable), outside the
    temp dir, so the sandbox's private /tmp is not what hides it."""
    parent = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="tidal-run-", dir=parent))
    folder.chmod(0o755)
    ensure_certificates(folder / "tls")
    (folder / "tls").chmod(0o755)
    yield folder
    shutil.rmtree(folder)


async def test_the_run_keys_are_unreadable(run_dir: Path) -> None:
    key = next((run_dir / "tls").glob("*.key"))
    result = await Sandbox().run(f"print(open({str(key)!r}).read())")
    assert result.exit_code == 1
    assert "PRIVATE KEY" not in result.stdout
    assert "FileNotFoundError" in result.stderr or "PermissionError" in result.stderr


async def test_the_run_folder_is_unwritable(run_dir: Path) -> None:
    result = await Sandbox().run(f"open({str(run_dir / 'pwned')!r}, 'w').write('x')")
    assert result.exit_code == 1
    assert not (run_dir / "pwned").exists()


@pytest.fixture(scope="module")
def add_problem() -> tuple[Task, Problem]:
    task = build_task(
        CodeTaskConfig(path=FIXTURES / "code_problems.jsonl", sandbox={"wall_s": ROOMY_WALL_S})
    )
    problems = [task.problem(i) for i in range(task.size())]
    return task, next(p for p in problems if "def add(" in p.reference)


FORGERIES = {
    "harness frame": (
        "import os, sys\n"
        "frame = sys._getframe()\n"
        "while frame is not None:\n"
        "    for value in list(frame.f_locals.values()):\n"
        "        if isinstance(value, str) and len(value) == 32:\n"
        "            os.write(1, ''.join('\\n%s %d\\n' % (value, i) for i in range(4)).encode())\n"
        "    frame = frame.f_back\n"
        "os._exit(0)\n"
    ),
    "equal to everything": (
        "class Anything:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "def add(a, b):\n"
        "    return Anything()\n"
    ),
}
SHADOWS_BUILTINS = (
    "def add(a, b):\n    return -1\ndef abs(x):\n    return 0\ndef set(*a):\n    return 0\n"
)


@pytest.mark.parametrize("program", FORGERIES.values(), ids=FORGERIES.keys())
def test_a_program_cannot_forge_a_pass(add_problem: tuple[Task, Problem], program: str) -> None:
    task, problem = add_problem
    assert task.verify(problem, program).reward == 0.0


def test_a_program_cannot_shadow_the_builtins_of_the_tests(
    add_problem: tuple[Task, Problem],
) -> None:
    task, problem = add_problem
    tests = ["assert abs(add(1, 2) - 3) < 1e-9", "assert set(add(1, 2)) == set([3])"]
    tricked = replace(problem, metadata={**problem.metadata, "test_list": tests})
    assert task.verify(tricked, SHADOWS_BUILTINS).reward == 0.0
    assert task.verify(tricked, "def add(a, b):\n    return a + b\n").reward == 0.5


def _unprivileged_python() -> tuple[list[str], str | None]:
    """A command that runs this suite as `nobody`, or why none can: an interpreter of this
    version that nobody can run (this venv's packages are added to it)."""
    if shutil.which("setpriv") is None:
        return [], "setpriv (util-linux) is not installed"
    python = next(
        (p for p in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable)
         if _runs_as_nobody(p)),
        None,
    )  # fmt: skip
    if python is None:
        return [], f"no Python {sys.version_info[0]}.{sys.version_info[1]} that nobody can run"
    drop = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    return [*drop, python], None


def _runs_as_nobody(python: str) -> bool:
    version = (
        "import os, sys; print(sys.version_info[:2] == "
        f"{tuple(sys.version_info[:2])} and os.access(os.path.realpath(sys.executable), os.X_OK))"
    )
    probe = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python, "-c"]
    try:
        done = subprocess.run([*probe, version], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.stdout.strip() == b"True"


@as_root
def test_the_battery_holds_as_an_unprivileged_user() -> None:
    command, why = _unprivileged_python()
    if why is not None:
        pytest.skip(f"cannot drop to an unprivileged user: {why}")
    site = sysconfig.get_paths()["purelib"]  # this venv's packages (and its editable paths)
    boot = (
        f"import site, sys; site.addsitedir({site!r}); import pytest; "
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {__file__!r}]))"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    # -S: the system interpreter's own site-packages (Debian's python3-protobuf, say) must
    # not shadow this venv's, which addsitedir adds.
    done = subprocess.run(
        [*command, "-S", "-c", boot], cwd=REPO, env=env, capture_output=True, timeout=240,
        check=False,
    )  # fmt: skip
    report = done.stdout.decode(errors="replace")[-3000:] + done.stderr.decode()[-2000:]
    assert done.returncode == 0, report
    assert " passed" in report and "skipped" in report  # this test itself skips as nobody
