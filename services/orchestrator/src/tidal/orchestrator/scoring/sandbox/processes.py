"""Start, feed, read and stop sandbox processes without blocking the caller's event loop.

Starting a process holds its caller until the child has exec'd, and removing a work dir
or killing a uid's processes holds it for as long as the disk or the scan takes; those
waits grow with the number of programs busy on the CPU, and a loop that takes them
stops answering its service's requests. So that work runs on a few
starter threads (per process: a forked worker builds its own), and the loop only
attaches to a started process's pipes and to its pidfd. Each process leads a session of
its own, whose autogroup gets the caller's niceness: where the kernel groups sessions for
the scheduler, that, not the nice value of its processes, is what makes them yield.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
Converse = Callable[[asyncio.StreamWriter, asyncio.StreamReader], Awaitable[None]]
"""Talks to a running program over its stdin and stdout (the pipes are the caller's)."""
STARTER_THREADS = 4
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _starters() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(STARTER_THREADS, thread_name_prefix="sandbox-start")
        return _pool


def _forget_starters() -> None:
    """In a forked child: the parent's pool has no threads here, and its lock may be held."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_starters)


async def off_loop(
    fn: Callable[..., T], *args: Any, abandon: Callable[[T], object] | None = None
) -> T:
    """`fn(*args)` on a starter thread. It runs to its end even if the caller is cancelled;
    then `abandon` gets its result, on a starter thread too (what it made is undone)."""
    work = asyncio.get_running_loop().run_in_executor(_starters(), functools.partial(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        if abandon is not None:
            work.add_done_callback(functools.partial(_abandoned, abandon))
        raise


def _abandoned(abandon: Callable[[T], object], work: asyncio.Future[T]) -> None:
    if not work.cancelled() and work.exception() is None:
        _starters().submit(abandon, work.result())


class Process:
    """A started process: its pid, its pipes as streams and a future done at its exit."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        streams: tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.StreamReader],
        transports: list[asyncio.BaseTransport],
    ) -> None:
        self._popen = popen
        self.stdin, self.stdout, self.stderr = streams
        self._transports = transports
        self.exited = _exit_of(popen)
        """Done when the process has exited and was reaped, even while something it
        started still holds its pipes."""

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def close(self) -> None:
        """Stop watching: the pipes close (a process that escaped and holds them reads end
        of file or a broken pipe); an exit not yet seen is reaped by `subprocess`."""
        self.exited.cancel()
        for transport in self._transports:
            transport.close()


async def start(
    argv: Sequence[str], *, cwd: Path, pass_fds: Sequence[int], limit: int, niceness: int
) -> Process:
    """Start `argv` from a starter thread in a session of its own, with no environment and
    three pipes (read `limit` bytes per line at most), and give that session's autogroup
    `niceness`. `pass_fds` go to the child and are closed here once it holds them, whatever
    happens to the caller."""
    popen = await off_loop(_popen, list(argv), cwd, tuple(pass_fds), niceness, abandon=_discard)
    try:
        return await _attach(asyncio.get_running_loop(), popen, limit)
    except BaseException:
        _starters().submit(_discard, popen)
        raise


def _popen(
    argv: list[str], cwd: Path, pass_fds: tuple[int, ...], niceness: int
) -> subprocess.Popen[bytes]:
    try:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env={},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    finally:
        for fd in pass_fds:
            os.close(fd)
    lower_autogroup(popen.pid, niceness)
    return popen


def lower_autogroup(session_pid: int, niceness: int) -> None:
    """Give the autogroup of the session `session_pid` leads `niceness`, where the kernel
    lets this process.

    Where the kernel's autogroup is on, each session is one scheduling entity weighing as
    much as the service's whole session, whatever the nice value of its processes: only
    the autogroup's own niceness makes a session of busy programs yield to the service.
    Without autogroup (disabled, or the file absent) the processes' nice value already
    applies. The kernel lets any process raise its autogroup's niceness, but accepts that
    from a caller without CAP_SYS_ADMIN only once per 100 ms machine-wide (EAGAIN)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{session_pid}/autogroup").write_text(str(niceness))


async def _attach(
    loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes], limit: int
) -> Process:
    assert popen.stdin and popen.stdout and popen.stderr
    transports: list[asyncio.BaseTransport] = []
    try:
        readers = []
        for pipe in (popen.stdout, popen.stderr):
            reader = asyncio.StreamReader(limit=limit, loop=loop)
            transport, _ = await loop.connect_read_pipe(
                functools.partial(asyncio.StreamReaderProtocol, reader, loop=loop), pipe
            )
            transports.append(transport)
            readers.append(reader)
        # the flow control asyncio's own subprocess streams use: drain() waits for the pipe
        transport, protocol = await loop.connect_write_pipe(
            functools.partial(asyncio.streams.FlowControlMixin, loop), popen.stdin
        )
        transports.append(transport)
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
    except BaseException:
        for transport in transports:
            transport.close()
        raise
    return Process(popen, (writer, readers[0], readers[1]), transports)


def _exit_of(popen: subprocess.Popen[bytes]) -> asyncio.Future[int | None]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int | None] = loop.create_future()

    def settle() -> None:
        if not done.done():
            done.set_result(popen.returncode)

    try:
        fd = os.pidfd_open(popen.pid)
    except OSError:  # a kernel before 5.3: a thread waits instead

        def wait() -> None:
            popen.wait()
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(settle)

        threading.Thread(target=wait, daemon=True).start()
        return done

    def readable() -> None:
        if popen.poll() is not None:
            settle()

    def close(_: asyncio.Future[int | None]) -> None:
        loop.remove_reader(fd)
        os.close(fd)

    done.add_done_callback(close)
    loop.add_reader(fd, readable)
    return done


def _discard(popen: subprocess.Popen[bytes]) -> None:
    """A process whose caller has gone (on a starter thread): killed, its pipes closed,
    reaped."""
    kill_group(popen.pid)
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()
    popen.wait()


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def kill_uid(uid: int) -> None:
    """Kill every process running as `uid` (what left its session), on a starter thread:
    as that uid, `kill(-1)` reaches them all at once; without setpriv, a scan of /proc."""
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
    if setpriv is None:
        _kill_uid_by_scan(uid)
        return
    subprocess.run(
        [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
         "/bin/sh", "-c", "kill -9 -1 2>/dev/null"],
        env={}, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def _kill_uid_by_scan(uid: int, rounds: int = 20) -> None:
    # a process may fork between a scan and its kill: scan again until none is left (the
    # uid's process limit bounds how many can appear)
    for _ in range(rounds):
        found = [int(p.name) for p in Path("/proc").iterdir() if _owned_by(p, uid)]
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _owned_by(entry: Path, uid: int) -> bool:
    try:
        return entry.name.isdigit() and entry.stat().st_uid == uid
    except OSError:
        return False


async def read_capped(stream: asyncio.StreamReader, cap: int, over: asyncio.Event) -> bytes:
    """Keep the first `cap` bytes and read the rest to end of file, discarding it: a pipe
    nobody reads stops its writer."""
    kept = bytearray()
    while chunk := await stream.read(1 << 16):
        if len(kept) < cap:
            kept += chunk[: cap - len(kept)]
            if len(kept) >= cap:
                over.set()
    return bytes(kept)


async def talk(
    converse: Converse, writer: asyncio.StreamWriter, reader: asyncio.StreamReader
) -> None:
    try:
        await converse(writer, reader)
    finally:
        writer.close()  # the program reads end of file: the conversation is over


async def feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        if data:
            writer.write(data)
            await writer.drain()
        writer.close()
