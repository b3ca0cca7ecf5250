"""An execution's files: a fresh `<root>/work` holding the program and its files, owned by
the execution's uid, removed when the execution ends.

The program may write in work, never in root (as root, the uid cannot; in bubblewrap,
root is a private directory of the sandbox's /tmp). A file named outside the work dir is
refused before anything is written there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from tidal.orchestrator.scoring.sandbox.uids import UIDS

PROGRAM_FILE = "main.py"


def make_workdir(uid: int | None) -> tuple[Path, Path]:
    """A fresh `<root>/work`: the program may write in work, never in root (as root, the
    uid cannot; in bubblewrap, root is a private directory of the sandbox's /tmp)."""
    root = Path(tempfile.mkdtemp(prefix="tidal-sandbox-"))
    root.chmod(0o711)
    workdir = root / "work"
    workdir.mkdir()
    if uid is not None:
        os.chown(workdir, uid, uid)
    return root, workdir


def prepare_workdir(
    program: str | Sequence[str], files: Mapping[str, str], uid: int | None, python: str
) -> tuple[Path, Path, list[str]]:
    """A fresh work dir holding `files` (and the program's source) as `uid`, and the
    program's argv."""
    if isinstance(program, str):
        files = {**files, PROGRAM_FILE: program}
        argv = [python, "-I", "-S", "-B", PROGRAM_FILE]
    else:
        argv = list(program)
    root, workdir = make_workdir(uid)
    try:
        for name, text in files.items():
            path = workdir / name
            if workdir not in path.resolve().parents:
                raise ValueError(f"sandbox file {name!r} is outside the work dir")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if uid is not None:
            for path in [workdir, *workdir.rglob("*")]:
                os.chown(path, uid, uid)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root, workdir, argv


def remove_workdir(prepared: tuple[Path, Path, list[str]]) -> None:
    """Remove a prepared work dir whose execution was abandoned before it started."""
    shutil.rmtree(prepared[0], ignore_errors=True)


def clean_up(root: Path | None, uid: int | None) -> None:
    """Remove an execution's files, then free its uid for another execution."""
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
    UIDS.give_back(uid)
