"""The traces file: a full disk drops spans with one warning, never a traceback per span."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tidal.common.config.shared import TelemetryConfig
from tidal.common.observability.tracing import TRACES_FILE, setup_telemetry

FULL = Path("/dev/full")  # every write(2) to it fails with ENOSPC


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full")
def test_spans_on_a_full_disk_are_dropped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / TRACES_FILE).symlink_to(FULL)
    provider = setup_telemetry("test", TelemetryConfig(traces_file=True), tmp_path)
    tracer = provider.get_tracer("test")
    with caplog.at_level(logging.INFO):
        for batch in range(3):  # three exports of five spans each
            for i in range(5):
                with tracer.start_as_current_span(f"span-{batch}-{i}"):
                    pass
            assert provider.force_flush(5_000)
        provider.shutdown()
    warnings = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name != "opentelemetry.trace"  # (provider reset)
    ]
    assert [r.getMessage() for r in warnings] == [
        f"cannot write {tmp_path / TRACES_FILE} ([Errno 28] No space left on device); "
        "dropping spans until it can"
    ]
    assert not any(r.exc_info for r in caplog.records)


def test_spans_are_written_one_line_each(tmp_path: Path) -> None:
    provider = setup_telemetry("test", TelemetryConfig(traces_file=True), tmp_path)
    tracer = provider.get_tracer("test")
    for i in range(3):
        with tracer.start_as_current_span(f"span-{i}"):
            pass
    provider.shutdown()
    lines = (tmp_path / TRACES_FILE).read_text().splitlines()
    assert [f'"name": "span-{i}"' in line for i, line in enumerate(lines)] == [True] * 3
