"""``shardbus run web`` as a process: it serves, its replicas share one port, it stops on
SIGTERM, and its log never carries a token."""

from __future__ import annotations

import json

import httpx

from shardbus.embedded import free_port
from tests.web.conftest import OPERATOR_TOKEN, WEBSITE_TOKEN


def _listening_url(log: str) -> str:
    for line in log.splitlines():
        if '"web door listening"' in line:
            return json.loads(line)["url"]
    raise AssertionError(f"no 'web door listening' line in:\n{log[-2000:]}")


def _door(services, port: int | str):
    return services.start("web", web_port=str(port), web_token=WEBSITE_TOKEN, web_operator_token=OPERATOR_TOKEN)


def test_the_door_serves_and_answers_503_for_a_shard_nobody_holds(services, unique):
    process = _door(services, 0)
    url = _listening_url(process.log())
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["nats"] is True and health.json()["protocol"] == 7
    refused = httpx.get(f"{url}/shards/s{unique}/items", timeout=10)
    assert refused.status_code == 401
    answer = httpx.get(f"{url}/shards/s{unique}/items", headers={"Authorization": f"Bearer {WEBSITE_TOKEN}"},
                       timeout=10)
    assert answer.status_code == 503 and answer.json() == {"error": "shard not connected"}
    assert services.stop(process) == 0
    log = process.log()
    assert WEBSITE_TOKEN not in log and OPERATOR_TOKEN not in log


def test_two_replicas_share_one_port_and_either_one_serves_it(services):
    port = free_port()  # claimed below the ephemeral range: no client takes it first
    first, second = _door(services, port), _door(services, port)
    assert _listening_url(first.log()) == _listening_url(second.log()) == f"http://127.0.0.1:{port}"
    assert services.stop(first) == 0
    for _ in range(5):  # the port is still served: by the second replica
        response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert response.status_code == 200
