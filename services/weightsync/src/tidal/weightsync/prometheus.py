"""Weight-sync's Prometheus metrics (docs/operations.md#metrics), on its `ServiceMetrics`.

The registry's state (newest version, versions held, replicas known) is read at scrape
time on the event loop (`LoopCollector`); publishes, uploads and fetches are counted by
the servicer as they complete, once per version or per 4 MiB chunk, never per byte.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from tidal.common.observability.prometheus import LoopCollector, ServiceMetrics
from tidal.weightsync.registry import VersionRegistry


def registry_families(registry: VersionRegistry) -> list[Metric]:
    """The registry's state as metric families (call on its loop)."""
    events = registry.all()
    replicas = registry.replicas
    served = [v for v in replicas.values() if v >= 0]
    return [
        GaugeMetricFamily(
            "tidal_weightsync_newest_version",
            "Newest registered version (-1 before any)",
            value=registry.newest,
        ),
        GaugeMetricFamily(
            "tidal_weightsync_versions_held", "Versions registered and on disk", value=len(events)
        ),
        GaugeMetricFamily(
            "tidal_weightsync_replicas",
            "Inference replicas registered (watching, or within their lease)",
            value=len(replicas),
        ),
        GaugeMetricFamily(
            "tidal_weightsync_oldest_served_version",
            "Oldest version an acknowledged replica serves (-1 when none has acknowledged one)",
            value=min(served, default=-1),
        ),
    ]


@dataclass(frozen=True)
class WeightSyncMetrics:
    published: Counter
    upload_seconds: Histogram
    fetched_bytes: Counter

    @classmethod
    def on(cls, metrics: ServiceMetrics, registry: VersionRegistry) -> WeightSyncMetrics:
        """Register the registry's scrape-time metrics (call on the service's loop)."""
        loop = asyncio.get_running_loop()
        metrics.register(LoopCollector(loop, lambda: registry_families(registry)))
        return cls(
            published=metrics.counter(
                "tidal_weightsync_versions_published", "Versions registered by this process"
            ),
            upload_seconds=metrics.histogram(
                "tidal_weightsync_upload_seconds",
                "Wall time of one UploadWeights stream (stream transport): receive, verify, "
                "register",
            ),
            fetched_bytes=metrics.counter(
                "tidal_weightsync_fetched_bytes", "Weight bytes served by FetchWeights"
            ),
        )
