"""Rank- and request-aware structured logging for every service.

One line per record: time, level, `service[rank]`, request id and trace id when inside an
RPC, the message, then `key=value` pairs passed as `extra={"fields": {...}}`. Plain text,
because the launcher tails these files into the terminal when a child dies; a person
reads them first, tools second.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from pathlib import Path

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class _ContextFilter(logging.Filter):
    def __init__(self, service: str, rank: int | None) -> None:
        super().__init__()
        self.tag = service if rank is None else f"{service}[{rank}]"

    def filter(self, record: logging.LogRecord) -> bool:
        record.tag = self.tag
        record.request_id = request_id_var.get()
        record.trace_id = _current_trace_id()
        fields = getattr(record, "fields", None)
        record.kv = "".join(f" {k}={v}" for k, v in fields.items()) if fields else ""
        return True


def _current_trace_id() -> str:
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - opentelemetry is a dependency of tidal-common
        return "-"
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else "-"


FORMAT = (
    "%(asctime)s %(levelname)s %(tag)s rid=%(request_id)s trace=%(trace_id)s "
    "%(name)s: %(message)s%(kv)s"
)


def setup_logging(
    service: str, *, level: str = "INFO", rank: int | None = None, log_file: Path | None = None
) -> None:
    """Configure the root logger once per process (stderr, plus a file when given)."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    context = _ContextFilter(service, rank)
    for handler in handlers:
        handler.addFilter(context)
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
    # grpc and urllib3 are chatty at INFO.
    logging.getLogger("grpc").setLevel(max(logging.WARNING, root.level))
