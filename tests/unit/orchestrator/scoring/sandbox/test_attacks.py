"""Hostile programs, scored by the code task through the verifier pool: each is contained,
scores 0 (it would pass every test had its attack worked) and ends within its deadline."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidal.common.security.credentials import ensure_certificates
from tidal.orchestrator.scoring.sandbox.uids import UID_BASE
from tidal.orchestrator.scoring.verifier_pool import VerifierPool
from tidal.orchestrator.task_config import CodeTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.orchestrator.tasks.base import Problem, Task

from .....helpers.sandbox_walls import ROOMY_WALL_S

FIXTURES = Path(__file__).parents[2] / "fixtures"
ADD = "\ndef add(a, b):\n    return a + b\n"
WALL_S = 2.0  # ends the attacks no limit of the sandbox ends first (the fork bomb)
VERIFIER_S = ROOMY_WALL_S + 30.0  # later than any sandbox: a verdict is the sandbox's
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root")


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A run folder every user may traverse (as on a shared host): only its files' modes
    and the sandbox's own uid keep a program out."""
    folder = Path(tempfile.mkdtemp(prefix="tidal-run-"))
    folder.chmod(0o755)
    ensure_certificates(folder / "tls")
    (folder / "tls").chmod(0o755)
    (folder / "victim.txt").write_text("keep me")
    (folder / "victim.txt").chmod(0o644)
    yield folder
    shutil.rmtree(folder)


def _add(name: str, wall_s: float) -> tuple[Task, Problem]:
    config = CodeTaskConfig(
        name=name, path=FIXTURES / "code_problems.jsonl", sandbox={"wall_s": wall_s, "cpu_s": 2}
    )
    task = build_task(config)
    problems = [task.problem(i) for i in range(task.size())]
    return task, next(p for p in problems if "def add(" in p.reference)


@pytest.fixture
def add_task() -> tuple[Task, Problem]:
    """The problem attacks are scored on: a short deadline."""
    return _add("add", WALL_S)


@pytest.fixture
def honest_add_task() -> tuple[Task, Problem]:
    """The same problem for honest programs: a deadline no loaded machine's start reaches,
    so only a broken pool or sandbox fails them."""
    return _add("add-honest", ROOMY_WALL_S)


def sandbox_processes() -> list[int]:
    """Live (not zombie) processes running as a sandbox uid."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid >= UID_BASE:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return pids


async def eventually_none(probe: Callable[[], list[int]], within_s: float = 3.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (found := probe()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # SIGKILL reaches every member of a group, not at once
    return found


@as_root
async def test_attacks_are_contained_and_score_zero(
    run_dir: Path, add_task: tuple[Task, Problem], honest_add_task: tuple[Task, Problem]
) -> None:
    task, problem = add_task
    honest_task, honest_problem = honest_add_task
    key = next((run_dir / "tls").glob("*.key"))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    attacks = {
        "infinite loop": "while True:\n    pass\n",
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
        "        pass\n",
        "memory hog": "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n",
        "write outside": f"open({str(run_dir / 'pwned')!r}, 'w').write('x')\n",
        "delete outside": f"import os\nos.remove({str(run_dir / 'victim.txt')!r})\n",
        "read tls keys": f"print(open({str(key)!r}).read())\n",
        "open a socket": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)\n",
        "print 1 GB": "import sys\nfor _ in range(1 << 14):\n"
        "    sys.stdout.write('x' * (1 << 16))\n",
    }
    tasks = {task.name: task, honest_task.name: honest_task}
    pool = VerifierPool(tasks, timeout_s=VERIFIER_S, max_workers=len(attacks))
    try:
        started = time.monotonic()
        outcomes = await pool.score(problem, [code + ADD for code in attacks.values()])
        elapsed = time.monotonic() - started
        honest = await pool.verify(honest_problem, ADD)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected
    finally:
        pool.close()
        listener.close()
    assert {name: o.reward for name, o in zip(attacks, outcomes, strict=True)} == dict.fromkeys(
        attacks, 0.0
    )
    assert [o.failure for o in outcomes] == [None] * len(
        attacks
    )  # the sandbox ended them, not the deadline
    assert elapsed < WALL_S + 8.0
    assert honest.reward == 1.0  # the orchestrator's pool is unaffected
    assert not (run_dir / "pwned").exists()
    assert (run_dir / "victim.txt").read_text() == "keep me"
    assert (
        await eventually_none(sandbox_processes) == []
    )  # the fork bomb's processes died with their group


@as_root
async def test_the_same_programs_without_their_attack_pass(
    honest_add_task: tuple[Task, Problem],
) -> None:
    task, problem = honest_add_task
    pool = VerifierPool({task.name: task}, timeout_s=VERIFIER_S, max_workers=2)
    try:
        outcomes = await pool.score(
            problem, ["import os\nos.getcwd()\n" + ADD, "print('x' * 100)\n" + ADD]
        )
    finally:
        pool.close()
    assert [o.reward for o in outcomes] == [1.0, 1.0]
