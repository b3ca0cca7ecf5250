"""What aiohttp logs for the OpenAI endpoint: each error counted, one line per kind per
window at most, never a traceback (no server: the logger aiohttp is handed, driven as
aiohttp drives it)."""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from tidal.inference.openai.server_log import RateLimitedServerLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refuse(logger: RateLimitedServerLog, exc: Exception) -> None:
    """What aiohttp's `RequestHandler.handle_error` does with a malformed request."""
    logger.exception("Error handling request from %s", "127.0.0.1", exc_info=exc)


def test_each_kind_is_one_line_a_window_without_a_traceback_and_every_error_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counted: list[str] = []
    clock = Clock()
    logger = RateLimitedServerLog(counted.append, window_s=60, clock=clock)
    bad_length = BadHttpMessage("Invalid character in Content-Length:\n\n  b'Content-Length: -1'")
    with caplog.at_level(logging.DEBUG):
        for _ in range(200):
            refuse(logger, bad_length)
        refuse(logger, ConnectionResetError("gone"))
        clock.now += 61
        refuse(logger, bad_length)
    lines = [r.getMessage() for r in caplog.records]
    assert counted == ["BadHttpMessage"] * 200 + ["ConnectionResetError", "BadHttpMessage"]
    assert len(lines) == 3 and not any(r.exc_info or r.exc_text for r in caplog.records)
    assert lines[0].startswith("HTTP BadHttpMessage: Error handling request from 127.0.0.1: ")
    assert "Invalid character in Content-Length: (0 more" in lines[0]
    assert "(199 more of this kind" in lines[2]
    assert "b'Content-Length" not in caplog.text  # the client's bytes stay out of the log
    assert all(len(line) < 400 for line in lines)


def test_a_detail_with_control_characters_is_one_printable_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        refuse(RateLimitedServerLog(), BadHttpMessage("bad \x1b[31mline\r" + "x" * 10_000))
    [line] = [r.getMessage() for r in caplog.records]
    assert "\x1b" not in line and "\r" not in line and len(line) < 400


def test_debug_lines_pass_through_only_when_enabled(caplog: pytest.LogCaptureFixture) -> None:
    logger = RateLimitedServerLog()
    with caplog.at_level(logging.INFO):
        logger.debug("Ignored premature client disconnection")
    with caplog.at_level(logging.DEBUG, logger="tidal.inference.openai.http"):
        logger.debug("Ignored premature client disconnection %d", 2)
    assert [r.getMessage() for r in caplog.records] == ["Ignored premature client disconnection 2"]
