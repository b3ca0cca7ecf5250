"""One Prometheus scrape as `{sample name{labels}: value}`, for the metrics tests."""

from __future__ import annotations

import ssl
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, context: ssl.SSLContext | None = None, token: str = "") -> dict[str, float]:
    """`{sample name{labels}: value}` of one scrape of `url` (a bearer `token` if given)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples
