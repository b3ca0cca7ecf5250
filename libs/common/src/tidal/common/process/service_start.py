"""The start of every service process: its config, file modes, logging and credentials.

One function so that the four services and torchrun's trainer start the same way: a
config error, a missing credential or a run folder's file policy is handled before any
server is built, and a service started by `tidal rl` dies with its launcher. Each service
also hands what start-up built to `settle_startup_heap` once it is all built: weight sync
before serving, inference once its engine holds the model, a one-process trainer once its
optimizer is built, the orchestrator once its plotting library is imported (during its
first step).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from typing import TypeVar

from tidal.common.config.loading import load_or_exit
from tidal.common.config.shared import ServiceRunConfig
from tidal.common.files.modes import apply_file_policy
from tidal.common.observability.logging import setup_logging
from tidal.common.process.launcher_watch import watch_launcher
from tidal.common.security.transport import check_or_exit

C = TypeVar("C", bound=ServiceRunConfig)


def start_service(
    cls: type[C], role: str, argv: Sequence[str] | None = None, *, check_credentials: bool = True
) -> C:
    """Load `role`'s run config from `argv` (default: the command line) or exit with the
    message, apply the run's file policy, set up logging, check the role's credentials
    (unless the caller checks its own config first), and watch the launcher (a no-op
    unless started by `tidal rl`)."""
    config = load_or_exit(
        cls, sys.argv[1:] if argv is None else argv, usage=f"tidal {role} @ cfg.toml"
    )
    apply_file_policy(shared_readable=config.run.shared_readable)
    setup_logging(role, level=config.telemetry.log_level)
    if check_credentials:
        check_or_exit(config, role)
    watch_launcher()
    return config


def settle_startup_heap() -> None:
    """Exempt every object alive now (modules, classes, the config, what start-up built)
    from later garbage collections, as `gc.freeze` does: they live as long as the process,
    and each full collection would walk them all again, a pause of tens of milliseconds
    on the event loop, more with torch imported. Called once, when start-up is done:
    after the imports, the model and whatever else a service holds for its whole life
    are loaded, before its first unit of work where it can; what serving allocates is
    collected as usual. No collection first: it would walk the whole heap on the start-up
    path to find next to nothing (the little cyclic garbage start-up leaves is kept)."""
    gc.freeze()
