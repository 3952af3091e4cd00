"""The web door's /metrics (services/web/metrics.py): a ``shardbus run web`` process scraped over
HTTP while requests are answered; a path no route takes is counted under ``other``, never by name."""

from __future__ import annotations

import httpx

from shardbus.embedded import free_port
from tests.scrape import label_values, scrape, value
from tests.web.conftest import OPERATOR_TOKEN, WEBSITE_TOKEN
from tests.web.test_process import _listening_url

REQUESTS = "shardbus_web_requests_total"


async def test_requests_move_their_series_by_route_template(services, unique) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    process = services.start("web", web_port="0", web_token=WEBSITE_TOKEN, web_operator_token=OPERATOR_TOKEN,
                             metrics_port=str(port))
    door = _listening_url(process.log())
    before = await scrape(url)
    assert value(before, "shardbus_nats_connected", service="web") == 1
    assert value(before, "shardbus_web_feed_clients") == 0

    async with httpx.AsyncClient(base_url=door, timeout=10) as client:
        assert (await client.get("/health")).status_code == 200
        for n in range(2):
            answer = await client.get(f"/shards/s{unique}{n}/items",
                                      headers={"Authorization": f"Bearer {WEBSITE_TOKEN}"})
            assert answer.status_code == 503
        assert (await client.get(f"/shards/s{unique}/items")).status_code == 401
        assert (await client.get(f"/zz-hostile-{unique}/../etc")).status_code == 404
    after = await scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    items = "/shards/{shard}/items"
    assert delta(REQUESTS, route="/health", method="GET", status="200") == 1
    assert delta(REQUESTS, route=items, method="GET", status="503") == 2
    assert delta(REQUESTS, route=items, method="GET", status="401") == 1
    assert delta(REQUESTS, route="other", method="GET", status="404") == 1
    assert delta("shardbus_web_request_duration_seconds_count", route=items) == 3
    routes = label_values(after, REQUESTS, "route")
    assert not any(unique in route for route in routes), routes  # neither a shard id nor a raw path
    assert "shardbus_web_feed_drops_total" in {name for name, _ in after}
