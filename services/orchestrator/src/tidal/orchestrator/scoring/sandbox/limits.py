"""Limits of one sandboxed execution: resource caps, the wall clock, network and concurrency.

One pydantic model, so a task's or a tool's sandbox is configured in TOML with the same
keys and help text everywhere. Limits bind the child process and everything it starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tidal.common.config.loading import BaseConfig

MAX_CONCURRENCY = 256


class SandboxLimits(BaseConfig):
    """Resource limits and isolation of sandboxed executions (see docs/agents.md)."""

    wall_s: float = Field(default=10.0, gt=0)
    """Wall-clock limit of one execution; at it the whole process group is killed."""
    cpu_s: int = Field(default=5, gt=0)
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: int = Field(default=512, ge=64)
    """Address space per process, MiB (RLIMIT_AS)."""
    file_size_mb: int = Field(default=16, gt=0)
    """Largest file a process may write, MiB (RLIMIT_FSIZE)."""
    processes: int = Field(default=16, gt=0)
    """Processes the execution may run at once (RLIMIT_NPROC of its own uid)."""
    open_files: int = Field(default=64, ge=16)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    output_bytes: int = Field(default=1 << 20, gt=0)
    """Bytes kept of stdout and of stderr each; more output kills the execution."""
    network: Literal["isolate", "best_effort", "allow"] = "best_effort"
    """isolate: run in a fresh network namespace or fail; best_effort: a namespace where
    the kernel allows one (a note on stderr where not); allow: the host's network."""
    max_concurrency: int = Field(default=8, gt=0, le=MAX_CONCURRENCY)
    """Executions running at once per executor; more wait for a slot."""
    isolation: Literal["auto", "bubblewrap", "process"] = "auto"
    """auto: bubblewrap where it is installed and usable, else the confined child process
    (a warning at start names what is weaker); bubblewrap: refuse to start without it;
    process: the confined child process alone (see docs/agents.md)."""
    python: str | None = None
    """Interpreter of source programs (run with -I -S: standard library only); unset:
    this service's Python where the sandbox uid can run it, else /usr/bin/python3."""
