"""The start of every service process: its config, file modes, logging and credentials.

One function so that the four services and torchrun's trainer start the same way: a
config error, a missing credential or a run folder's file policy is handled before any
server is built, and a service started by `tidal rl` dies with its launcher.
"""

from __future__ import annotations

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
