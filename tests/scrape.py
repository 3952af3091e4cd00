"""Reading a service's real ``/metrics`` endpoint over HTTP, for the metrics tests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""Every sample of a scrape: (name, its labels) → value."""


async def scrape(url: str, timeout: float = 5.0) -> Samples:
    """One scrape of ``url`` (``http://host:port/metrics``), parsed by prometheus_client."""
    async with httpx.AsyncClient(timeout=timeout) as client:
        response = await client.get(url)
    response.raise_for_status()
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` (0 when absent)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def label_values(samples: Samples, name: str, label: str) -> set[str]:
    """Every value ``label`` takes among the samples called ``name``."""
    return {dict(labels)[label] for (sample, labels), _ in samples.items() if sample == name and label in dict(labels)}


def names(samples: Samples) -> set[str]:
    """The names of every sample."""
    return {name for name, _ in samples}
