"""A completion's tests run here, in the trusted process; its program runs in the sandbox.

The sandboxed harness loads the program (then the problem's setup code) as a module and
answers calls: a function's name and plain-value arguments in, its plain-value result or
the name of the exception it raised out (plain_values.py). The tests run in this process
against proxies of the program's names, so the verdict is decided where the program
cannot reach and no secret ever enters the sandbox: a program that exits early, prints a
fake report, inspects the harness's frames or returns an object that equals everything
passes nothing. A program's function that hangs is ended by the sandbox's deadline, and
every test after it fails.
"""

from __future__ import annotations

import asyncio
import builtins
import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidal.orchestrator.tasks.plain_values import decode, dumps, encode

SERVE = """
import os, sys

def _serve():
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the program's own output goes to stderr, never into the replies
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)

    def send(message):
        replies.write(dumps(message))
        replies.flush()

    namespace = {"__name__": "solution"}
    for name in ("solution.py", "setup.py"):
        with open(name) as f:
            source = f.read()
        try:
            exec(compile(source, name, "exec"), namespace)
        except BaseException as exc:
            send(["failed", "%s: %s" % (type(exc).__name__, str(exc)[:200])])
            return
    names = {}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if type(value).__name__ == "module":
            names[name] = ["module", value.__name__]
        elif callable(value):
            names[name] = ["callable", None]
        else:
            try:
                names[name] = ["value", encode(value)]
            except Exception:
                pass
    send(["ready", names])
    for line in requests:
        try:
            name, args, kwargs = json.loads(line)
            reply = ["value", encode(namespace[name](*decode(args), **decode(kwargs)))]
        except BaseException as exc:
            reply = ["raised", type(exc).__name__, str(exc)[:1000]]
        send(reply)

_serve()
"""
HARNESS = Path(__file__).with_name("plain_values.py").read_text() + SERVE
"""The sandboxed side: the codec's source, then the loop that answers calls."""
UNSAFE_MODULES = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"}
FENCED = re.compile(r"```[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


class SandboxedCallFailed(RuntimeError):
    """A call into the program raised an exception that is not a builtin one, or broke."""


Call = Callable[[str, tuple[Any, ...], dict[str, Any]], Any]


class RemoteFunction:
    """A name the program defined that can be called: each call crosses to the sandbox."""

    def __init__(self, name: str, call: Call) -> None:
        self._name, self._call = name, call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<sandboxed {self._name}>"


def _raised(name: str, message: str) -> BaseException:
    """The builtin exception the program raised (so `except ValueError` tests work), else
    a `SandboxedCallFailed`; never a `BaseException` that would stop the tests."""
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(message)
    return SandboxedCallFailed(f"{name}: {message}")


class Channel:
    """Calls from the tests' thread, answered by the harness over the program's pipes."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader,
        timeout_s: float,
    ) -> None:
        self.loop, self.writer, self.reader, self.timeout_s = loop, writer, reader, timeout_s
        self.lock = asyncio.Lock()

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = dumps([name, encode(args), encode(kwargs)])
        future = asyncio.run_coroutine_threadsafe(self._exchange(request), self.loop)
        reply = future.result(timeout=self.timeout_s)
        if reply[0] == "value":
            return decode(reply[1])
        raise _raised(str(reply[1]), str(reply[2]))

    async def _exchange(self, request: str) -> list[Any]:
        async with self.lock:
            self.writer.write(request.encode())
            await self.writer.drain()
            line = await self.reader.readline()
        if not line:
            raise SandboxedCallFailed("the program ended")
        reply = json.loads(line)
        if not isinstance(reply, list) or len(reply) not in (2, 3):
            raise SandboxedCallFailed("malformed reply")
        return reply


def bind_names(names: dict[str, Any], call: Call) -> dict[str, Any]:
    """The tests' namespace: a proxy per callable the program defined, its plain values,
    and the standard library modules it imported (imported here, never its own). A name
    of a builtin is never bound: the tests' `abs`, `set` or `sorted` stay the real ones."""
    namespace: dict[str, Any] = {"__name__": "__tests__"}
    for name, (kind, data) in names.items():
        if not isinstance(name, str) or name.startswith("__") or hasattr(builtins, name):
            continue
        if kind == "callable":
            namespace[name] = RemoteFunction(name, call)
        elif kind == "value":
            namespace[name] = decode(data)
        elif kind == "module" and data == name and _stdlib(name):
            namespace[name] = importlib.import_module(str(data))
    return namespace


def _stdlib(module: str) -> bool:
    top = module.partition(".")[0]
    return top in sys.stdlib_module_names and top not in UNSAFE_MODULES


def run_tests(
    names: dict[str, Any], call: Call, setup: str, tests: list[str], passed: set[int]
) -> None:
    """Run setup code and each test against the program's names; add each pass to `passed`
    as it happens (a later hang keeps what passed before)."""
    namespace = bind_names(names, call)
    try:
        exec(compile(setup, "setup.py", "exec"), namespace)
    except Exception:
        return
    for i, test in enumerate(tests):
        try:
            exec(compile(test, f"test_{i}.py", "exec"), namespace)
        except Exception:
            continue
        passed.add(i)


def extract_program(completion: str) -> str:
    """The first fenced code block of a completion, or the whole completion."""
    match = FENCED.search(completion)
    return match.group(1) if match else completion
