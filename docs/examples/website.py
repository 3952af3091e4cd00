"""A website calling the web door through a Python client generated from its OpenAPI document
(docs/web.md, "The OpenAPI document"):

    openapi-python-client generate --path docs/openapi/web.json --output-path web_api --meta none

tests/system/test_typed_client.py generates ``web_api`` beside this file and type-checks both
with ``mypy --strict``: a route, a field or a status the document no longer has fails the suite."""

from __future__ import annotations

from web_api import AuthenticatedClient
from web_api.api.ledger import create_run_runs_post, run_console_runs_run_id_get
from web_api.api.sidecar_any_shard import board_guilds_shard_shards_shard_guilds_get
from web_api.models import CreateRun, Error


def main(url: str, token: str) -> None:
    door = AuthenticatedClient(base_url=url, token=token)
    created = create_run_runs_post.sync(client=door, body=CreateRun(shard="uo1", event="invasion"))
    if created is None or isinstance(created, Error):
        raise SystemExit(f"POST /runs refused: {created.error if created else 'no answer'}")
    run_id: str = created.run.run_id
    console = run_console_runs_run_id_get.sync(run_id, client=door, limit=50)
    if console is None or isinstance(console, Error):
        raise SystemExit(f"GET /runs/{run_id} refused")
    print(run_id, console.run.status, console.counts)
    guilds = board_guilds_shard_shards_shard_guilds_get.sync("uo1", client=door)
    if guilds is None or isinstance(guilds, Error):
        raise SystemExit("GET /shards/uo1/guilds refused")
    for guild in guilds:
        print(guild.additional_properties.get("name"))
