"""Prometheus metrics of one service: the `[metrics]` section, its registry, its endpoint.

One registry per service, so two in-process servers never mix their numbers, served by an
HTTP server of our own beside the gRPC server, with gRPC's TLS rules. State that lives on
the event loop is read at scrape time on the loop thread (`LoopCollector`), adding nothing
to the hot path (docs/operations.md, "Metrics").
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from pydantic import Field

from tidal.common.config.loading import BaseConfig
from tidal.common.security.config import is_loopback

log = logging.getLogger(__name__)

RESTARTS_ENV = "TIDAL_RESTARTS"
"""Set by `tidal rl` on a restarted child: how many times it was restarted before."""
PATH = "/metrics"
LOOP_READ_TIMEOUT_S = 2.0

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Histogram buckets of every `_seconds` metric: milliseconds (a tiny model's load) to
minutes (a large model's step)."""


class MetricsConfig(BaseConfig):
    enabled: bool = True
    """Serve Prometheus metrics at `/metrics` (docs/operations.md#metrics)."""
    port_offset: int = Field(default=1000, ge=1, le=65535)
    """The metrics port is the service's gRPC port plus this (orchestrator 50051 → 51051)."""
    port: int | None = Field(default=None, ge=0, le=65535)
    """The metrics port of this one process, overriding `port_offset` (0: any free port).
    `tidal rl` sets it per child and lists every child's address in
    `<run dir>/prometheus_targets.json`; set it only for a service started alone."""


def restarts_from_env() -> int:
    value = os.environ.get(RESTARTS_ENV, "0")
    try:
        return max(0, int(value))
    except ValueError:
        log.warning("%s=%r is not a count; reporting 0 restarts", RESTARTS_ENV, value)
        return 0


@dataclass(frozen=True)
class TlsMaterial:
    """What the HTTPS endpoint needs: the service's key pair, and how clients prove they
    belong to the run (the CA for "mtls", the token digests for "token")."""

    mode: str
    cert_pem: bytes = b""
    key_pem: bytes = b""
    ca_pem: bytes = b""
    verifiers: frozenset[str] = frozenset()
    """sha256 hex digests of every role's token (token mode)."""


class ServiceMetrics:
    """The registry and endpoint of one service process."""

    def __init__(self, service: str, config: MetricsConfig | None = None) -> None:
        self.service = service
        self.config = config or MetricsConfig()
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.gauge("tidal_service_info", "1, labelled with the service", ["service"]).labels(
            service=service
        ).set(1)
        restarts = self.counter(
            "tidal_restarts", "Restarts of this service by `tidal rl` before this process started"
        )
        restarts.inc(restarts_from_env())
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.address: str | None = None
        """host:port the endpoint listens on, once started."""
        self.scheme = "http"

    # ---- metric constructors (on this service's registry) -------------------------------

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), registry=self.registry)

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = SECONDS_BUCKETS,
    ) -> Histogram:
        return Histogram(name, doc, list(labels), registry=self.registry, buckets=buckets)

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    # ---- the endpoint -----------------------------------------------------------------

    def port_for(self, grpc_port: int) -> int:
        """The metrics port of a server configured on `grpc_port` (0, any free port,
        gives 0: any free port too)."""
        if self.config.port is not None:
            return self.config.port
        if grpc_port == 0:
            return 0
        port = grpc_port + self.config.port_offset
        if port > 65535:
            raise ValueError(
                f"metrics port {grpc_port} + metrics.port_offset {self.config.port_offset} is "
                "past 65535: lower metrics.port_offset or set metrics.port"
            )
        return port

    def start(self, host: str, grpc_port: int, tls: TlsMaterial | None) -> None:
        """Serve `/metrics` on `host` (the gRPC bind host). Plain HTTP on loopback; any
        other host needs `tls` (ValueError naming the fix when there is none)."""
        if not self.config.enabled or self._server is not None:
            return
        port = self.port_for(grpc_port)
        context = None
        if not is_loopback(host):
            if tls is None or tls.mode == "plaintext":
                raise ValueError(
                    f"refusing to serve metrics on {host}:{port} without TLS: plain HTTP is for "
                    'loopback only (set security.mode = "mtls" or "token", bind loopback, or '
                    "set metrics.enabled = false)"
                )
            context = server_tls_context(tls)
        app = make_wsgi_app(self.registry)
        if context is not None and tls is not None and tls.mode == "token":
            app = _bearer_guard(app, tls.verifiers)
        server_class = _V6Server if ":" in host else _V4Server
        try:
            server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics on {host}:{port} ({exc.strerror}): set metrics.port, "
                "change metrics.port_offset, or set metrics.enabled = false"
            ) from exc
        if context is not None:
            # The handshake runs on the request's own thread (at its first read), so a
            # client that connects and stalls cannot block the accepting thread.
            server.socket = context.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"
        self._server = server
        bound_port = server.socket.getsockname()[1]
        self.address = f"[{host}]:{bound_port}" if ":" in host else f"{host}:{bound_port}"
        self._thread = threading.Thread(
            target=server.serve_forever, name=f"metrics-{self.service}", daemon=True
        )
        self._thread.start()
        log.info("metrics at %s://%s%s", self.scheme, self.address, PATH)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None
        self.address = None

    @property
    def url(self) -> str | None:
        return None if self.address is None else f"{self.scheme}://{self.address}{PATH}"


def server_tls_context(tls: TlsMaterial) -> ssl.SSLContext:
    """TLS server context from PEM bytes (ssl loads a key pair only from files: they go to
    a private temporary file that is deleted at once)."""
    import tempfile

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.NamedTemporaryFile("wb", suffix=".pem") as pair:  # created 0600
        pair.write(tls.cert_pem + b"\n" + tls.key_pem)
        pair.flush()
        context.load_cert_chain(pair.name)
    if tls.mode == "mtls":
        context.load_verify_locations(cadata=tls.ca_pem.decode())
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _bearer_guard(app: Any, verifiers: frozenset[str]) -> Any:
    """Token mode: answer 401 unless the request carries any role's bearer token."""
    import hashlib

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = environ.get("HTTP_AUTHORIZATION", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        if not token or hashlib.sha256(token.encode()).hexdigest() not in verifiers:
            start_response("401 Unauthorized", [("Content-Type", "text/plain")])
            return [b"a bearer token of this run is required\n"]
        return app(environ, start_response)  # type: ignore[no-any-return]

    return guarded


class _V4Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A refused handshake or a dropped scraper is the client's problem: one line, no
        # traceback on the service's stderr.
        log.debug("metrics: request from %s failed", client_address, exc_info=True)


class _V6Server(_V4Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 10  # seconds a scraper may stall (handshake included) before it is dropped

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


class LoopCollector(Collector):
    """Metrics read at scrape time on an asyncio loop's thread.

    `read` runs on `loop` (so it may touch anything the loop owns) and returns metric
    families; a loop busy for longer than `LOOP_READ_TIMEOUT_S` yields none this scrape.
    """

    def __init__(self, loop: Any, read: Callable[[], list[Metric]]) -> None:
        self.loop = loop
        self.read = read

    def collect(self) -> Iterator[Metric]:
        done: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(self.read())
            except Exception as exc:  # reported below, on the scrape's thread
                done.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(run)
            families = done.result(timeout=LOOP_READ_TIMEOUT_S)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:  # busy or closed loop
            log.debug("metrics: no loop snapshot this scrape (%s)", exc)
            return
        except Exception:  # a broken reading must not take the other metrics with it
            log.exception("metrics: reading the service's state failed")
            return
        yield from families

    def describe(self) -> Iterator[Metric]:
        return iter(())  # read lazily: registering must not run `read` off the loop
