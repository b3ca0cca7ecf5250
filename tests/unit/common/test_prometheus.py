"""The metrics endpoint (tidal.common.observability.prometheus): scraped over real HTTP(S) sockets.

Loopback is plain HTTP; any other host is HTTPS with the service's certificate, and a
scraper must prove it belongs to the run (mTLS certificate or bearer token); without TLS
it is refused. Each service's registry is its own.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.server import GrpcServer, tls_material
from tidal.common.observability.prometheus import (
    RESTARTS_ENV,
    LoopCollector,
    MetricsConfig,
    ServiceMetrics,
    TlsMaterial,
)
from tidal.common.security.transport import PLAINTEXT_LOOPBACK

from ...metrics_scrape import scrape
from ...tls_fixtures import role_security


def test_loopback_scrape_is_plain_http_with_process_and_service_metrics(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(RESTARTS_ENV, "3")
    metrics = ServiceMetrics("trainer")
    steps = metrics.counter("tidal_test_steps", "steps")
    steps.inc(5)
    metrics.start("127.0.0.1", 0, None)
    url = metrics.url
    try:
        assert url is not None and url.startswith("http://127.0.0.1:")
        samples = scrape(url)
    finally:
        metrics.stop()
    assert samples['tidal_service_info{service="trainer"}'] == 1
    assert samples["tidal_restarts_total"] == 3  # what `tidal rl` told the restarted child
    assert samples["tidal_test_steps_total"] == 5
    assert samples["process_resident_memory_bytes"] > 0
    assert "process_cpu_seconds_total" in samples
    assert metrics.url is None
    with pytest.raises(urllib.error.URLError):  # stopped: nothing listens any more
        scrape(url)


def test_each_service_has_its_own_registry() -> None:
    a, b = ServiceMetrics("inference"), ServiceMetrics("inference")
    a.counter("tidal_same_name", "x").inc(1)
    b.counter("tidal_same_name", "x").inc(2)  # no "Duplicated timeseries" across services
    a.start("127.0.0.1", 0, None)
    b.start("127.0.0.1", 0, None)
    try:
        assert a.url and b.url
        assert scrape(a.url)["tidal_same_name_total"] == 1
        assert scrape(b.url)["tidal_same_name_total"] == 2
    finally:
        a.stop()
        b.stop()


def test_port_is_grpc_port_plus_offset_or_the_override() -> None:
    assert ServiceMetrics("x").port_for(50051) == 51051
    assert ServiceMetrics("x", MetricsConfig(port_offset=7)).port_for(50051) == 50058
    assert ServiceMetrics("x", MetricsConfig(port=9100)).port_for(50051) == 9100
    assert ServiceMetrics("x").port_for(0) == 0  # gRPC on any free port: metrics too
    with pytest.raises(ValueError, match=r"metrics\.port_offset"):
        ServiceMetrics("x").port_for(65000)


@pytest.mark.parametrize("tls", [None, TlsMaterial("plaintext")])
def test_non_loopback_without_tls_is_refused(tls: TlsMaterial | None) -> None:
    metrics = ServiceMetrics("weightsync")
    with pytest.raises(ValueError, match="without TLS") as err:
        metrics.start("0.0.0.0", 0, tls)
    assert 'security.mode = "mtls"' in str(err.value)
    assert metrics.url is None


def test_disabled_serves_nothing() -> None:
    metrics = ServiceMetrics("orchestrator", MetricsConfig(enabled=False))
    metrics.start("0.0.0.0", 0, None)  # not even the plaintext check: nothing is served
    assert metrics.url is None


def _client_context(folder: Path, role: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(folder / "ca.pem"))
    if role is not None:
        context.load_cert_chain(str(folder / f"{role}.pem"), str(folder / f"{role}.key"))
    return context


def _local_url(metrics: ServiceMetrics) -> str:
    """The endpoint bound on 0.0.0.0, dialled on loopback (the certificates cover it)."""
    assert metrics.address is not None
    return f"https://127.0.0.1:{metrics.address.rsplit(':', 1)[1]}/metrics"


def test_beyond_loopback_mtls_needs_a_certificate_of_the_run(tls_folder: Path) -> None:
    metrics = ServiceMetrics("trainer")
    metrics.start("0.0.0.0", 0, tls_material(role_security(tls_folder, "trainer")))
    try:
        assert metrics.scheme == "https"
        url = _local_url(metrics)
        samples = scrape(url, _client_context(tls_folder, "operator"))
        assert samples['tidal_service_info{service="trainer"}'] == 1
        with pytest.raises(OSError):  # the handshake fails
            scrape(url, _client_context(tls_folder, None))  # no client certificate
        with pytest.raises(OSError):
            scrape(url.replace("https", "http"))  # plain HTTP is not served there
    finally:
        metrics.stop()


def test_beyond_loopback_token_mode_needs_a_bearer_token(tls_folder: Path) -> None:
    metrics = ServiceMetrics("inference")
    metrics.start("0.0.0.0", 0, tls_material(role_security(tls_folder, "inference", "token")))
    try:
        url, context = _local_url(metrics), _client_context(tls_folder, None)
        token = (tls_folder / "operator.token").read_text().strip()
        assert scrape(url, context, token)['tidal_service_info{service="inference"}'] == 1
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(url, context, "operator.not-the-token")
        assert refused.value.code == 401
    finally:
        metrics.stop()


async def test_grpc_server_runs_the_endpoint_with_its_lifecycle() -> None:
    metrics = ServiceMetrics("orchestrator")
    server = GrpcServer(
        "127.0.0.1:0", [], GrpcConfig(), security=PLAINTEXT_LOOPBACK, metrics=metrics
    )
    await server.start()
    url = metrics.url
    assert url is not None
    samples = await asyncio.to_thread(scrape, url)
    assert samples['tidal_service_info{service="orchestrator"}'] == 1
    await server.stop()
    assert metrics.url is None
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(scrape, url)


async def test_loop_collector_reads_on_the_loop_thread() -> None:
    metrics = ServiceMetrics("inference")
    threads: list[int] = []

    def read() -> list[GaugeMetricFamily]:
        threads.append(threading.get_ident())
        return [GaugeMetricFamily("tidal_test_queue", "queued", value=4)]

    metrics.register(LoopCollector(asyncio.get_running_loop(), read))
    metrics.start("127.0.0.1", 0, None)
    try:
        assert metrics.url is not None
        samples = await asyncio.to_thread(scrape, metrics.url)
    finally:
        metrics.stop()
    assert samples["tidal_test_queue"] == 4
    assert threads == [threading.get_ident()]
