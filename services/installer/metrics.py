"""The installer's series (docs/operations.md, "Metrics"), ``shardbus_installer_…``: the site
installer's outcomes and the fetcher's bytes, read at scrape time by :func:`collector`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from services.installer.download import Fetcher
from services.installer.site_installer import OUTCOMES, SiteInstaller
from shared.metrics import PREFIX

NAME = f"{PREFIX}installer_"


def collector(site: Callable[[], SiteInstaller | None], fetcher: Fetcher) -> Callable[[], Iterator[Metric]]:
    """The series at scrape time (``site()`` is None until the site is open: zeros)."""

    def collect() -> Iterator[Metric]:
        installer = site()
        outcomes = dict(installer.outcomes) if installer else dict.fromkeys(OUTCOMES, 0)
        installs = CounterMetricFamily(f"{NAME}installs_total", "Installs, by outcome.", labels=["outcome"])
        for outcome, n in outcomes.items():
            installs.add_metric([outcome], n)
        yield installs
        yield CounterMetricFamily(f"{NAME}fetched_bytes_total", "Bytes fetched from release servers.",
                                  value=fetcher.fetched_bytes)

    return collect
