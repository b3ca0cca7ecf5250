"""What aiohttp logs for the OpenAI endpoint: counted, one line per kind per minute at most.

aiohttp answers malformed HTTP itself (a `Content-Length: -1`, a bad chunk size, a broken
request line) before any handler or middleware runs, so before the API key is checked,
and logs each at ERROR with its traceback. A client with no key could then fill the run's
disk. This logger takes aiohttp's place: each error is counted per kind (the exception's
class) in `tidal_inference_http_errors_total`, and a kind is logged as one line, with no
traceback, at most once per `window_s`, saying how many more were counted meanwhile.
Kinds are exception classes, so their number is bounded by the code, not by the clients.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("tidal.inference.openai.http")

WINDOW_S = 60.0
_DETAIL_CHARS = 160


def _first_line(exc: BaseException) -> str:
    """The exception's message, first line only, printable ASCII only, cut short: it may
    quote the client's bytes."""
    text = str(getattr(exc, "message", "") or exc).strip().splitlines()
    line = text[0] if text else ""
    return "".join(c if " " <= c <= "~" else "?" for c in line[:_DETAIL_CHARS])


class RateLimitedServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger for aiohttp's `RequestHandler(logger=...)`: errors counted and rate-limited,
    the rest (debug lines, off by default) passed on."""

    def __init__(
        self,
        count: Callable[[str], None] | None = None,
        *,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(log, {})
        self._count = count
        self.window_s, self._clock = window_s, clock
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if level < logging.ERROR:
            if self.logger.isEnabledFor(level):
                self.logger.log(level, msg, *args, **kwargs)
            return
        exc = kwargs.get("exc_info")
        exc = exc if isinstance(exc, BaseException) else None
        kind = type(exc).__name__ if exc is not None else "error"
        if self._count is not None:
            self._count(kind)
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.window_s:
            self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
            return
        self._last[kind] = now
        unlogged = self._unlogged.pop(kind, 0)
        detail = _first_line(exc) if exc is not None else ""
        self.logger.error(
            "HTTP %s: %s%s (%d more of this kind since it was last logged; each is counted "
            "in tidal_inference_http_errors_total, logged at most once a minute)",
            kind,
            str(msg) % args if args else msg,
            f": {detail}" if detail else "",
            unlogged,
        )
