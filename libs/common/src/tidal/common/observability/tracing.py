"""OpenTelemetry setup: one tracer provider per process, three exporters.

A JSONL file (`<run dir>/traces.jsonl`, shared by a run's services: each span is one
`os.write` on an O_APPEND descriptor, so lines never interleave), the console, and
OTLP/gRPC when `telemetry.otlp_endpoint` is set. Context crosses processes in gRPC
metadata and weight publishes in a W3C carrier (docs/architecture.md, "Tracing").
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

from tidal.common.config.shared import TelemetryConfig

TRACES_FILE = "traces.jsonl"
log = logging.getLogger(__name__)


class AppendLineSink:
    """File-like sink: each write is one O_APPEND syscall, so lines never interleave. A
    failed write (a full disk) drops its span and is logged once, not once per span."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.dropped = 0
        """Spans not written since the last write that succeeded."""

    def write(self, text: str) -> int:
        try:
            written = os.write(self._fd, text.encode())
        except OSError as exc:
            if not self.dropped:
                log.warning("cannot write %s (%s); dropping spans until it can", self.path, exc)
            self.dropped += 1
            return 0
        if self.dropped:
            log.info("writing spans to %s again (%d dropped)", self.path, self.dropped)
            self.dropped = 0
        return written

    def flush(self) -> None:
        pass


def _one_line(span: object) -> str:
    return span.to_json(indent=None) + "\n"  # type: ignore[attr-defined]


def setup_telemetry(
    service: str, config: TelemetryConfig, run_dir: Path | None = None
) -> TracerProvider:
    """Install the global tracer provider for `service`; call `provider.shutdown()` at exit."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"tidal-{service}"}))
    if config.traces_file and run_dir is not None:
        sink = AppendLineSink(run_dir / TRACES_FILE)
        exporter = ConsoleSpanExporter(out=sink, formatter=_one_line)  # type: ignore[arg-type]
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    if config.console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    if config.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        otlp = OTLPSpanExporter(endpoint=config.otlp_endpoint, insecure=True)
        provider.add_span_processor(BatchSpanProcessor(otlp))
    trace.set_tracer_provider(provider)
    return provider


def inject_carrier() -> dict[str, str]:
    """The current trace context as a W3C carrier dict (to store in a message)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract_carrier(carrier: Mapping[str, str]) -> otel_context.Context:
    """A context whose parent span is the one described by `carrier`."""
    return propagate.extract(dict(carrier))
