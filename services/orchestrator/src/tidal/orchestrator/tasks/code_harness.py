"""The program that runs one completion's tests inside the sandbox, and the reading of its report.

The harness loads the completion as a module, then runs each test in its namespace and
reports a pass as a line holding a per-run nonce it read from stdin before the program
ran, written to a duplicate of stdout: a program that exits early, raises or prints fake
results passes nothing. A program that introspects the harness's frames could still find
the nonce; the sandbox bounds what it can do, not what it can claim (docs/agents.md).
"""

from __future__ import annotations

import re

HARNESS = """
import json, os, sys

def _run():
    nonce = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)
    report = os.dup(1)
    with open("tests.json") as f:
        spec = json.load(f)
    os.remove("tests.json")
    with open("solution.py") as f:
        source = f.read()
    namespace = {"__name__": "solution"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
        exec(compile(spec["setup"], "setup.py", "exec"), namespace)
    except BaseException:
        return
    for i, test in enumerate(spec["tests"]):
        try:
            exec(compile(test, "test_%d.py" % i, "exec"), namespace)
        except BaseException:
            continue
        os.write(report, ("\\n%s %d\\n" % (nonce, i)).encode())

_run()
"""
FENCED = re.compile(r"```[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_program(completion: str) -> str:
    """The first fenced code block of a completion, or the whole completion."""
    match = FENCED.search(completion)
    return match.group(1) if match else completion


def passed_tests(stdout: str, nonce: str, count: int) -> int:
    """How many distinct tests the harness reported as passed."""
    passed = set()
    for line in stdout.splitlines():
        head, _, index = line.partition(" ")
        if head == nonce and index.isdigit() and int(index) < count:
            passed.add(int(index))
    return len(passed)
